module github.com/leaseq/leaseq

go 1.26.8

require (
	capnproto.org/go/capnp/v3 v3.1.0-alpha.2 // indirect
	github.com/HdrHistogram/hdrhistogram-go v1.1.2 // indirect
	github.com/apple/foundationdb/bindings/go v0.0.0-20260629183922-51e1c42eb9a8 // indirect
	github.com/benbjohnson/clock v1.3.5 // indirect
	github.com/colega/zeropool v0.0.0-20230505084239-6fb4a4f75381 // indirect
	github.com/linxGnu/grocksdb v1.7.15 // indirect
	github.com/prometheus/client_golang v1.23.2 // indirect
	github.com/stretchr/testify v1.11.1 // indirect
	go.uber.org/goleak v1.3.0 // indirect
	golang.org/x/sync v0.7.0 // indirect
)
