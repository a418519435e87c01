package httpapi

import (
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
)

// Requests meet two rules before any route, the API's and the
// dashboard's (found by review, session 70):
//
//   - DNS rebinding: a page of another site whose name the attacker points
//     at the node's address is, to the browser, of the same origin as
//     itself; its requests reach the node with that name in Host, and a
//     browser sends no Sec-Fetch-Site or Origin with a same-origin GET to
//     a plain-http origin, so such a request cannot be told from a
//     non-browser's by its headers. Every request over TCP must name the
//     node by an IP address, "localhost", a name under ".localhost", or a
//     name in Config.AllowedHosts (`leaseq serve --http-host`); others get
//     421 Misdirected Request. A unix socket, which no browser reaches, is
//     not held to it.
//   - Cross-site requests: a page of another site may send a POST without
//     a preflight (a "simple" request: no body or a form's content type,
//     mode no-cors) and, though it cannot read the answer, have it acted
//     on: a poll costs the item an attempt, and repeated ones dead-letter
//     it. A request other than GET or HEAD whose Sec-Fetch-Site is
//     cross-site or same-site, or whose Origin is not the request's Host,
//     gets 403.
func (s *Server) hostGuard(next http.Handler) http.Handler {
	return HostGuard(s.cfg.AllowedHosts, s.log, next)
}

// HostGuard holds the requests to next to the rules above, with allowed
// as the extra host names (Config.AllowedHosts) and log for the refusals.
// leaseq serve puts its other HTTP listeners (--metrics, --pprof) behind
// it too: what they show, queue names and counts, profiles and heap
// dumps, is as much the node's as the API is, so a rebinding page must
// not read them either.
func HostGuard(allowed []string, log *slog.Logger, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if la, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && la.Network() == "unix" {
			next.ServeHTTP(w, r)
			return
		}
		if !hostAllowed(allowed, r.Host) {
			log.Warn("request for another host name refused (DNS rebinding?)", "remote", r.RemoteAddr, "host", r.Host, "path", r.URL.Path)
			http.Error(w, "421 misdirected request: this node does not answer to host "+r.Host+" (leaseq serve --http-host)", http.StatusMisdirectedRequest)
			return
		}
		site, origin := r.Header.Get("Sec-Fetch-Site"), r.Header.Get("Origin")
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if site == "cross-site" || site == "same-site" || origin != "" && !originIsHost(origin, r.Host) {
				log.Warn("cross-site request refused", "remote", r.RemoteAddr, "path", r.URL.Path, "sec_fetch_site", site, "origin", origin)
				http.Error(w, "403 forbidden: a request from another site", http.StatusForbidden)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// hostAllowed reports whether a browser may reach the node by host (a
// Host header, host[:port]), given the extra names allowed.
func hostAllowed(allowed []string, host string) bool {
	name := host
	if h, _, err := net.SplitHostPort(host); err == nil {
		name = h
	}
	name = strings.TrimSuffix(strings.ToLower(strings.Trim(name, "[]")), ".")
	if name == "" {
		return false
	}
	if net.ParseIP(name) != nil || name == "localhost" || strings.HasSuffix(name, ".localhost") {
		return true
	}
	for _, a := range allowed {
		if strings.EqualFold(strings.TrimSuffix(a, "."), name) {
			return true
		}
	}
	return false
}

// originIsHost reports whether the Origin header origin names host
// (host[:port], compared without case); "null" never does.
func originIsHost(origin, host string) bool {
	u, err := url.Parse(origin)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	return strings.EqualFold(u.Host, host)
}
