package httpui

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"html/template"
	"net/http"
	"net/url"
	"strings"
)

// sessionCookie is the cookie a browser gets for a valid --http-token.
const sessionCookie = "mmfeed_session"

// sessionValue is the cookie value for token: a hash, so the cookie does not
// hold the token itself.
func sessionValue(token string) string {
	h := sha256.Sum256([]byte("mmfeed-session\x00" + token))
	return hex.EncodeToString(h[:])
}

// authorized reports whether r carries the bearer token or the session cookie.
func (s *Server) authorized(r *http.Request) bool {
	if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+s.cfg.Token)) == 1 {
		return true
	}
	c, err := r.Cookie(sessionCookie)
	return err == nil && subtle.ConstantTimeCompare([]byte(c.Value), []byte(sessionValue(s.cfg.Token))) == 1
}

func (s *Server) tokenOK(t string) bool {
	return t != "" && subtle.ConstantTimeCompare([]byte(t), []byte(s.cfg.Token)) == 1
}

// setSession gives the browser the session cookie (HttpOnly, SameSite=Strict).
func (s *Server) setSession(w http.ResponseWriter) {
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: sessionValue(s.cfg.Token), Path: "/",
		HttpOnly: true, SameSite: http.SameSiteStrictMode})
}

func (s *Server) auth(h http.Handler) http.Handler {
	if s.cfg.Token == "" {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if t := r.URL.Query().Get("token"); t != "" && s.tokenOK(t) { // exchange the URL token for a cookie
			s.setSession(w)
			u := *r.URL
			q := u.Query()
			q.Del("token")
			u.RawQuery = q.Encode()
			http.Redirect(w, r, u.RequestURI(), http.StatusSeeOther)
			return
		}
		if !s.authorized(r) {
			if strings.Contains(r.Header.Get("Accept"), "text/html") && r.URL.Query().Get("part") == "" {
				http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="mmfeed"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// login shows the sign-in form (GET) and exchanges a valid token for the
// session cookie (POST, or GET with ?token=), then redirects to next (a
// local path) or /.
func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	next := localPath(r.FormValue("next"))
	if s.cfg.Token == "" {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	t := r.FormValue("token")
	if s.tokenOK(t) {
		s.setSession(w)
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if t != "" {
		w.WriteHeader(http.StatusUnauthorized)
	}
	_ = loginTmpl.Execute(w, struct {
		Next  string
		Wrong bool
	}{next, t != ""})
}

// localPath returns next when it is a path of this origin, else "/": one
// leading slash, then printable ASCII only, no backslash (browsers drop tabs
// and newlines from a URL and read "\\" as "/", so "/\t/evil.example" or
// "/\\evil.example" would lead to another host), and it must parse as a
// URL with neither scheme nor host. The pages' own links (url.QueryEscape of
// a request URI) always pass.
func localPath(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") {
		return "/"
	}
	for i := 0; i < len(next); i++ {
		if c := next[i]; c <= ' ' || c >= 0x7f || c == '\\' {
			return "/"
		}
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || u.Opaque != "" || !strings.HasPrefix(u.Path, "/") {
		return "/"
	}
	return next
}

var loginTmpl = template.Must(template.New("login").Parse(`<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>mmfeed: sign in</title>
<style>body{font-family:system-ui,sans-serif;margin:3em auto;max-width:26em}input{font-size:1em;padding:.3em}</style></head><body>
<h1>mmfeed</h1>{{if .Wrong}}<p style="color:#D55E00"><b>That token is not valid.</b></p>{{end}}
<form method="post" action="/login"><input type="hidden" name="next" value="{{.Next}}">
<label>HTTP token (--http-token) <input type="password" name="token" autofocus required></label> <button type="submit">Sign in</button></form>
</body></html>
`))
