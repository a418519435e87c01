package rpc

import "os"

var (
	osMkdirTemp = os.MkdirTemp
	osRemoveAll = os.RemoveAll
)
