package httpui

import (
	"bytes"
	"net/http"
	"strings"

	"github.com/mmfeed/mmfeed/balancer"
)

// reportPage serves `/`: the balance report with its live section, as the
// source views it.
type reportPage struct {
	src Source
}

// handler serves `/`: balancer.LiveHandler of view, except that the full
// page of a mixture carries its per-source section (View.Section). The
// JSON and the polled live fragment are LiveHandler's.
func (p *reportPage) handler() http.Handler {
	plain := balancer.LiveHandler(p.view)
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		q := req.URL.Query()
		if q.Get("format") == "json" || q.Get("part") == "live" || strings.Contains(req.Header.Get("Accept"), "application/json") {
			plain.ServeHTTP(w, req)
			return
		}
		v := p.src.View()
		if v == nil || v.Section == nil {
			plain.ServeHTTP(w, req)
			return
		}
		var page bytes.Buffer
		if err := balancer.WritePage(&page, v.Report, v.Live, "?part=live"); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		b, err := v.Section.InsertHTML(page.Bytes())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		_, _ = w.Write(b)
	})
}

// view returns the report and its live section, or nils before the first epoch.
func (p *reportPage) view() (*balancer.Report, *balancer.LiveView) {
	v := p.src.View()
	if v == nil {
		return nil, nil
	}
	return v.Report, v.Live
}
