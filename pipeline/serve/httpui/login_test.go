package httpui

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestBrowserSignIn: a browser cannot send a bearer header, so a token from
// the login form or the URL is exchanged for a session cookie, which then
// authorises the page and its live polls.
func TestBrowserSignIn(t *testing.T) {
	s := &Server{cfg: Config{Token: "s3cret"}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /login", s.login)
	mux.HandleFunc("POST /login", s.login)
	mux.Handle("GET /{$}", s.auth(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("report")) })))
	cookie := &http.Cookie{Name: sessionCookie, Value: sessionValue("s3cret")}
	type req struct {
		method, target, form, accept string
		cookie                       *http.Cookie
	}
	tests := []struct {
		name       string
		req        req
		code       int
		location   string
		setsCookie bool
		body       string
	}{
		{"page without auth redirects a browser to the form", req{"GET", "/?part=", "", "text/html", nil}, 303, "/login?next=%2F%3Fpart%3D", false, ""},
		{"a poll without auth is refused", req{"GET", "/?part=live", "", "text/html", nil}, 401, "", false, "unauthorized"},
		{"a script without auth is refused", req{"GET", "/", "", "application/json", nil}, 401, "", false, "unauthorized"},
		{"form", req{"GET", "/login", "", "text/html", nil}, 200, "", false, `name="token"`},
		{"wrong token", req{"POST", "/login", "token=nope&next=/", "", nil}, 401, "", false, "not valid"},
		{"right token", req{"POST", "/login", "token=s3cret&next=/%3Fx%3D1", "", nil}, 303, "/?x=1", true, ""},
		{"no open redirect", req{"POST", "/login", "token=s3cret&next=//evil.example/", "", nil}, 303, "/", true, ""},
		{"no open redirect through a tab", req{"GET", "/login?token=s3cret&next=/%09/evil.example", "", "", nil}, 303, "/", true, ""},
		{"no open redirect through a tab (form)", req{"POST", "/login", "token=s3cret&next=/%09/evil.example", "", nil}, 303, "/", true, ""},
		{"no open redirect through a newline", req{"POST", "/login", "token=s3cret&next=/%0A/evil.example", "", nil}, 303, "/", true, ""},
		{"no open redirect through a carriage return", req{"POST", "/login", "token=s3cret&next=/%0D/evil.example", "", nil}, 303, "/", true, ""},
		{"no open redirect through a backslash", req{"POST", "/login", "token=s3cret&next=/%5Cevil.example", "", nil}, 303, "/", true, ""},
		{"no open redirect through a space", req{"POST", "/login", "token=s3cret&next=/%20/evil.example", "", nil}, 303, "/", true, ""},
		{"no open redirect through non-ASCII", req{"POST", "/login", "token=s3cret&next=/%E3%80%80/evil.example", "", nil}, 303, "/", true, ""},
		{"no open redirect to a scheme", req{"POST", "/login", "token=s3cret&next=https://evil.example/", "", nil}, 303, "/", true, ""},
		{"the form keeps only a local next", req{"GET", "/login?next=/%09/evil.example", "", "text/html", nil}, 200, "", false, `name="next" value="/"`},
		{"a local path with a query is kept", req{"POST", "/login", "token=s3cret&next=/%3Fpart%3Dlive%26a%3D%252F", "", nil}, 303, "/?part=live&a=%2F", true, ""},
		{"token in the URL", req{"GET", "/?token=s3cret&part=live", "", "", nil}, 303, "/?part=live", true, ""},
		{"wrong token in the URL", req{"GET", "/?token=nope", "", "", nil}, 401, "", false, ""},
		{"cookie", req{"GET", "/", "", "text/html", cookie}, 200, "", false, "report"},
		{"forged cookie", req{"GET", "/", "", "", &http.Cookie{Name: sessionCookie, Value: "s3cret"}}, 401, "", false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest(tt.req.method, tt.req.target, strings.NewReader(tt.req.form))
			if tt.req.form != "" {
				r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			}
			if tt.req.accept != "" {
				r.Header.Set("Accept", tt.req.accept)
			}
			if tt.req.cookie != nil {
				r.AddCookie(tt.req.cookie)
			}
			w := httptest.NewRecorder()
			mux.ServeHTTP(w, r)
			if w.Code != tt.code || w.Header().Get("Location") != tt.location || !strings.Contains(w.Body.String(), tt.body) {
				t.Errorf("got %d location %q body %.80q, want %d %q containing %q", w.Code, w.Header().Get("Location"), w.Body.String(), tt.code, tt.location, tt.body)
			}
			set := w.Result().Cookies()
			if got := len(set) == 1 && set[0].Value == sessionValue("s3cret") && set[0].HttpOnly; got != tt.setsCookie {
				t.Errorf("sets the session cookie: %v, want %v (%v)", got, tt.setsCookie, set)
			}
		})
	}
	if strings.Contains(sessionValue("s3cret"), "s3cret") || sessionValue("a") == sessionValue("b") {
		t.Error("the cookie must be a hash of the token")
	}
}
