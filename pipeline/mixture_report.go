package pipeline

import (
	"fmt"
	"io"
	"math"

	"github.com/mmfeed/mmfeed/balancer"
)

// MixtureReport is what a plan of a mixture epoch takes from each source:
// its realised share of the planned draws against the share its weight asks
// for, and its samples, tokens and cost per step.
type MixtureReport struct {
	// Steps and Planned are the plan's steps and real (weight 1) entries.
	Steps   int                   `json:"steps"`
	Planned int                   `json:"planned"`
	Sources []MixtureSourceReport `json:"sources"`
}

// MixtureSourceReport is one source's line of a MixtureReport. Per-step
// figures are means over the plan's steps, Min and Max the extremes.
type MixtureSourceReport struct {
	MixtureSource
	// WantShare is the weight over the sum of weights; Share is Planned
	// over the plan's planned draws.
	WantShare float64 `json:"want_share"`
	Share     float64 `json:"share"`
	Planned   int     `json:"planned"`
	// Repeats counts the planned draws that repeat a sample.
	Repeats            int     `json:"repeats"`
	SamplesPerStep     float64 `json:"samples_per_step"`
	MinSamplesPerStep  int     `json:"min_samples_per_step"`
	MaxSamplesPerStep  int     `json:"max_samples_per_step"`
	TextTokensPerStep  float64 `json:"text_tokens_per_step"`
	ImageTokensPerStep float64 `json:"image_tokens_per_step"`
	CostPerStep        float64 `json:"cost_per_step"`
}

// MixtureReport summarises plan (a plan of p's Features.Items) by source;
// nil for a plain input.
func (p *Prepared) MixtureReport(plan *balancer.Plan) *MixtureReport {
	if p.ds == nil || p.ds.mix == nil {
		return nil
	}
	srcs := p.ds.MixtureSources()
	r := &MixtureReport{Steps: len(plan.Steps), Sources: make([]MixtureSourceReport, len(srcs))}
	var weights float64
	for _, s := range srcs {
		weights += s.Weight
	}
	for i, s := range srcs {
		r.Sources[i] = MixtureSourceReport{MixtureSource: s, WantShare: s.Weight / weights, MinSamplesPerStep: math.MaxInt}
	}
	items := plan.Items()
	perStep := make([]int, len(srcs))
	for _, st := range plan.Steps {
		clear(perStep)
		for _, rank := range st.Ranks {
			for _, mb := range rank {
				for _, e := range mb {
					if e.Weight == 0 {
						continue
					}
					i := int(e.Item)
					s := &r.Sources[p.SourceOf(i)]
					perStep[p.SourceOf(i)]++
					s.Planned++
					if p.Features.Repeat(i) > 0 {
						s.Repeats++
					}
					it := items[i]
					s.TextTokensPerStep += float64(it.TextTokens)
					s.ImageTokensPerStep += float64(it.ImageTokens)
					s.CostPerStep += plan.Config.Placement.StepCost(plan.Config.Model.Cost(it))
				}
			}
		}
		for i, n := range perStep {
			r.Sources[i].MinSamplesPerStep = min(r.Sources[i].MinSamplesPerStep, n)
			r.Sources[i].MaxSamplesPerStep = max(r.Sources[i].MaxSamplesPerStep, n)
		}
	}
	for i := range r.Sources {
		r.Planned += r.Sources[i].Planned
	}
	for i := range r.Sources {
		s := &r.Sources[i]
		if r.Planned > 0 {
			s.Share = float64(s.Planned) / float64(r.Planned)
		}
		if r.Steps > 0 {
			n := float64(r.Steps)
			s.SamplesPerStep = float64(s.Planned) / n
			s.TextTokensPerStep /= n
			s.ImageTokensPerStep /= n
			s.CostPerStep /= n
		} else {
			s.MinSamplesPerStep = 0
		}
	}
	return r
}

// WriteText writes the report as a table, one line per source.
func (r *MixtureReport) WriteText(w io.Writer) error {
	fmt.Fprintf(w, "mixture: %d planned draws over %d steps\n", r.Planned, r.Steps)
	fmt.Fprintf(w, "  %-16s %8s %8s %8s %9s %9s %8s %15s %12s %12s %12s\n", "source", "weight", "want", "share", "samples", "draws", "repeats",
		"samples/step", "text tok/st", "image tok/st", "cost/step")
	for _, s := range r.Sources {
		fmt.Fprintf(w, "  %-16s %8.3g %7.2f%% %7.2f%% %9d %9d %8d %6.1f [%3d,%3d] %12.1f %12.1f %12.4g\n", s.Name, s.Weight, 100*s.WantShare, 100*s.Share,
			s.Samples, s.Draws, s.Repeats, s.SamplesPerStep, s.MinSamplesPerStep, s.MaxSamplesPerStep, s.TextTokensPerStep, s.ImageTokensPerStep, s.CostPerStep)
	}
	_, err := fmt.Fprintln(w)
	return err
}
