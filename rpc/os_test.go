package rpc

import (
	"errors"
	"os"
)

var (
	osMkdirTemp = os.MkdirTemp
	osRemoveAll = os.RemoveAll
)

func errorsAs(err error, target any) bool { return errors.As(err, target) }
