package serve

import (
	"errors"
	"net/http"
	"time"

	"github.com/mmfeed/mmfeed/pipeline"
	"github.com/mmfeed/mmfeed/pipeline/serve/httpui"
	"github.com/mmfeed/mmfeed/pipeline/serve/report"
)

// Handler returns the read-only HTTP API (httpui.Server.Handler): /v1/report,
// /v1/cost-model, /metrics, /healthz, /login and /.
func (s *Service) Handler() http.Handler { return s.newHTTP().Handler() }

// newHTTP returns the report server of the service's configuration,
// answering from the service.
func (s *Service) newHTTP() *httpui.Server {
	cfg := httpui.Config{Addr: s.cfg.HTTP, TLSCert: s.cfg.HTTPTLSCert, TLSKey: s.cfg.HTTPTLSKey, Token: s.cfg.HTTPToken}
	return httpui.New(cfg, &httpAnswers{s: s, views: report.NewViews(s.cal)}, s.reg)
}

// httpAnswers is the service as the report server's source: each verb
// reads the service through the methods of its parts.
type httpAnswers struct {
	s     *Service
	views *report.Views
}

// Healthy: the NATS connection is up and health.problems has none.
func (a *httpAnswers) Healthy() error {
	s := a.s
	if s.nc == nil || !s.nc.IsConnected() {
		return errors.New("nats not connected")
	}
	if why := s.health.problems(time.Now(), s.cfg.StuckAfter, s.streamHasRoom()); why != "" {
		return errors.New(why)
	}
	return nil
}

// Report is the live report (snapshot), or the planning status before it.
func (a *httpAnswers) Report() (any, error) {
	if r := a.s.snapshot(); r != nil {
		return r, nil
	}
	return nil, errors.New(a.s.live.PlanningStatus())
}

// CostModel is the cost model in effect (costModel).
func (a *httpAnswers) CostModel() any { return a.s.costModel() }

// View is the live report as the page shows it, with a mixture's section.
func (a *httpAnswers) View() *httpui.View {
	r := a.s.snapshot()
	if r == nil {
		return nil
	}
	v := &httpui.View{Report: r.Report, Live: a.views.LiveView(r.Report, r.Live)}
	if r.Mixture != nil {
		v.Section = mixtureSection{r.Mixture}
	}
	return v
}

// mixtureSection is a mixture's per-source section of the page.
type mixtureSection struct{ r *pipeline.MixtureReport }

func (m mixtureSection) InsertHTML(page []byte) ([]byte, error) {
	return pipeline.InsertMixtureHTML(page, m.r)
}
