// Package httpui is the HTTP side of `mmfeed serve`: the report server,
// its limits and listener, the read-only routes, the browser's sign-in and
// the live report page. It answers from a Source and renders nothing of its
// own beyond the sign-in form: the pages are balancer's (LiveHandler,
// WritePage).
//
// # Inputs and outputs
//
// New takes a Config (listen address, TLS certificate and key, token), a
// Source and a prometheus.Gatherer. Server.Handler serves
//
//   - GET /healthz: "ok" (200), or Source.Healthy's error (503);
//   - GET /v1/report: Source.Report as indented JSON, or its error (503);
//   - GET /v1/cost-model: Source.CostModel as indented JSON;
//   - GET /metrics: the Gatherer's families and the Go runtime and process
//     collectors' (once each, whatever the Gatherer already has);
//   - GET / : balancer.LiveHandler of Source.View (the page, its JSON and
//     the live fragment it polls, ?part=live); a View with a Section gets
//     the full page with the section inserted (a mixture's per-source lines);
//   - GET and POST /login: the sign-in form, and the exchange of a token for
//     the session cookie mmfeed_session (HttpOnly, SameSite=Strict, a hash of
//     the token), then a redirect to a local path only.
//
// With a token, every route but /healthz and /login needs "Authorization:
// Bearer <token>" or the session cookie; a token in a page's URL is
// exchanged for the cookie; a browser without either is sent to /login,
// anything else gets 401. Server.Listen listens on plain TCP or TLS (1.2 at
// least); Serve and Shutdown run the server with the limits of one client
// (header, read, write and idle times, header bytes).
//
// # Ownership and concurrency
//
// httpui owns the http.Server and its listener, and nothing of the
// service: it never reads the service's fields nor takes its locks, only
// calls the Source's verbs, which return values the handler owns; Source
// implementations must be safe for concurrent use. A Server is used by one
// Serve at a time; Handler may be called from any goroutine. httpui imports
// balancer and prometheus and nothing else of this module; serve implements
// Source and wires New into Run (internal/arch).
package httpui
