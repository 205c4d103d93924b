package pipeline

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/internal/reportcheck"
)

// TestMixtureHTML: a mixture's report page carries one row per source whose
// every number (weight, shares, samples, draws, repeats, samples, tokens and
// cost per step) equals the JSON's "mixture" value it names by data-key, in
// a section before the per-step charts; a plain input's page is unchanged.
func TestMixtureHTML(t *testing.T) {
	cfg := mixConfig(t, 300, 100, 20, 0, "")
	prep, err := Prepare(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer prep.Close()
	rep, err := prep.Report()
	if err != nil {
		t.Fatal(err)
	}
	plan, err := prep.Plan(cfg.Plan.Strategy)
	if err != nil {
		t.Fatal(err)
	}
	mix := prep.MixtureReport(plan)
	var page bytes.Buffer
	if err := WriteReportHTML(&page, rep, mix); err != nil {
		t.Fatal(err)
	}
	js, err := json.Marshal(struct {
		Mixture *MixtureReport `json:"mixture"`
	}{mix})
	if err != nil {
		t.Fatal(err)
	}
	n, err := reportcheck.Compare(sectionOf(t, page.String()), js)
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 + 13*len(mix.Sources); n != want {
		t.Errorf("%d numbers with a data-key in the mixture section, want %d", n, want)
	}
	vals := reportcheck.Values(page.String())
	for i, s := range mix.Sources {
		if got := vals[fmt.Sprintf("mixture.sources.%d.share", i)]; got != fmt.Sprintf("%.4f", s.Share) || !strings.Contains(page.String(), "<td>"+s.Name+"</td>") {
			t.Errorf("source %s: page shows share %q, want %.4f and its name", s.Name, got, s.Share)
		}
	}
	if m, e := strings.Index(page.String(), `id="mixture"`), strings.Index(page.String(), "<h2>Every step</h2>"); m < 0 || e < 0 || m > e {
		t.Errorf("mixture section at %d, per-step charts at %d: want the section first", m, e)
	}
	var plain, want bytes.Buffer
	mustOK(t, WriteReportHTML(&plain, rep, nil))
	mustOK(t, balancer.WriteHTML(&want, rep))
	if !bytes.Equal(plain.Bytes(), want.Bytes()) {
		t.Error("a plain input's page differs from balancer.WriteHTML's")
	}
}

// sectionOf returns the mixture section of page.
func sectionOf(t *testing.T, page string) string {
	t.Helper()
	lo := strings.Index(page, `<h2 id="mixture">`)
	hi := strings.Index(page[max(lo, 0):], "</table>")
	if lo < 0 || hi < 0 {
		t.Fatalf("no mixture section in the page")
	}
	return page[lo : lo+hi]
}
