package webui

import (
	"net/http"
	"net/url"
	"strings"
)

// contentSecurityPolicy allows the dashboard's own script, styles and
// forms only: no inline script (app.js is a file), no framing (the actions
// are buttons, which a framing page could trick a user into clicking), and
// forms that post nowhere else.
const contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// guard wraps next with the checks every request passes: a verified client
// certificate when required, the same-origin rule for anything but GET and
// HEAD, and the security headers.
func (u *UI) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", contentSecurityPolicy)
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		// same-origin keeps the Referer on the dashboard's own form posts
		// (sameOrigin falls back on it) and sends it nowhere else.
		h.Set("Referrer-Policy", "same-origin")
		if u.reqCert && !verifiedClient(r) {
			u.log.Warn("request without a verified client certificate refused", "remote", r.RemoteAddr, "path", r.URL.Path)
			u.errorPage(w, r, http.StatusForbidden, "Client certificate required",
				"This node requires a verified TLS client certificate for the dashboard.")
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if ok, why := sameOrigin(r); !ok {
				u.log.Warn("cross-origin request refused", "remote", r.RemoteAddr, "path", r.URL.Path, "why", why)
				u.errorPage(w, r, http.StatusForbidden, "Request refused",
					"Changes are accepted only from the dashboard's own pages ("+why+"). Reload the page and try again.")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// verifiedClient reports whether r came over TLS with a client certificate
// that verified against the server's client CAs.
func verifiedClient(r *http.Request) bool {
	return r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0
}

// sameOrigin reports whether a state-changing request comes from a page of
// this same origin, and if not, why. A browser that sends Sec-Fetch-Site
// says so directly; otherwise the host of Origin (or, without one, of
// Referer) must be the request's Host. A request with none of the three is
// refused: browsers send at least one on a form post, and a script that
// wants to act on the node has the RPC interface.
func sameOrigin(r *http.Request) (bool, string) {
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "same-origin":
		return true, ""
	case "cross-site", "same-site":
		return false, "Sec-Fetch-Site is " + site
	}
	// "none" (a user-initiated navigation) or no header (an older browser):
	// fall back on the headers that name the sender.
	if o := r.Header.Get("Origin"); o != "" {
		if sameHost(o, r.Host) {
			return true, ""
		}
		return false, "Origin does not match the Host"
	}
	if ref := r.Referer(); ref != "" {
		if sameHost(ref, r.Host) {
			return true, ""
		}
		return false, "Referer does not match the Host"
	}
	return false, "no Sec-Fetch-Site, Origin or Referer header"
}

// sameHost reports whether the absolute URL raw names host (host[:port],
// compared without case). "null" and relative URLs never match.
func sameHost(raw, host string) bool {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false
	}
	return host != "" && strings.EqualFold(u.Host, host)
}
