package rpc

import (
	"context"
	"log/slog"
	"strings"
)

// quietHandler demotes go-capnp's reports of ordinary disconnects. go-capnp
// logs every peer that closes its connection (or resets it) at ERROR with
// only the error text, so the text is all there is to go on; matching it
// here is the one place we read an error's words, and it only changes a log
// level, never behaviour.
type quietHandler struct{ slog.Handler }

var disconnectPhrases = []string{
	"connection closed",
	"connection reset",
	"broken pipe",
	"use of closed network connection",
	"io: read/write on closed pipe",
	"EOF",
	"context canceled",
}

// clientFaultPhrases are go-capnp ERROR reports of a peer breaking the
// node's limits (a message over --max-message): the peer's fault, which
// the node survives by closing that connection, so WARN.
var clientFaultPhrases = []string{
	"message too large",
}

func (h quietHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level > slog.LevelWarn {
		for _, p := range clientFaultPhrases {
			if strings.Contains(r.Message, p) {
				r2 := slog.NewRecord(r.Time, slog.LevelWarn, r.Message, r.PC)
				r.Attrs(func(a slog.Attr) bool { r2.AddAttrs(a); return true })
				return h.Handler.Handle(ctx, r2)
			}
		}
	}
	if r.Level >= slog.LevelWarn {
		for _, p := range disconnectPhrases {
			if strings.Contains(r.Message, p) {
				if !h.Handler.Enabled(ctx, slog.LevelDebug) {
					return nil
				}
				r2 := slog.NewRecord(r.Time, slog.LevelDebug, r.Message, r.PC)
				r.Attrs(func(a slog.Attr) bool { r2.AddAttrs(a); return true })
				return h.Handler.Handle(ctx, r2)
			}
		}
	}
	return h.Handler.Handle(ctx, r)
}

func (h quietHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return quietHandler{h.Handler.WithAttrs(as)}
}

func (h quietHandler) WithGroup(name string) slog.Handler {
	return quietHandler{h.Handler.WithGroup(name)}
}

// capnpLogger wraps l for go-capnp's rpc.Options.Logger.
func capnpLogger(l *slog.Logger) *slog.Logger {
	return slog.New(quietHandler{l.Handler()}).With("svc", "capnp")
}

// discardLogger is used when the caller passes no logger.
func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
