package webui_test

import (
	"log/slog"
	"net/http"
	"os"

	"github.com/benbjohnson/clock"

	"github.com/leaseq/leaseq/rpc/webui"
	"github.com/leaseq/leaseq/storage/rocksstore"
)

// The dashboard mounted at /ui/ of a node's HTTP listener. The handler
// wants the full request path (no http.StripPrefix): it serves
// Config.Prefix+"/" and below.
func Example() {
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	store, err := rocksstore.Open("./data", rocksstore.Options{Logger: logger})
	if err != nil {
		logger.Error("open", "err", err)
		return
	}
	defer store.Close()

	ui, err := webui.New(webui.Config{
		Store:  store,
		Clock:  clock.New(),
		Logger: logger,
		Prefix: "/ui",
		// RequireClientCert: true when the listener does mutual TLS.
		// OnReady: rpcServer.Wake, so a redrive wakes parked long polls.
	})
	if err != nil {
		logger.Error("dashboard", "err", err)
		return
	}
	defer ui.Close()

	mux := http.NewServeMux()
	mux.Handle("/ui/", ui.Handler())
	_ = http.ListenAndServe("127.0.0.1:7780", mux)
}
