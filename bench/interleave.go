package main

import (
	"fmt"
	"slices"
	"strings"
)

// benchSide is one side of a side-by-side benchmark: one timed pass, returning a rate.
type benchSide struct {
	name string
	pass func() (float64, error)
}

// interleave runs every side once per round, reversing the order every other round, so
// all sides see the same machine load; it returns each side's rate per round.
func interleave(sides []benchSide, rounds int) (map[string][]float64, error) {
	rates := map[string][]float64{}
	for round := range rounds {
		order := slices.Clone(sides)
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, s := range order {
			r, err := s.pass()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", s.name, err)
			}
			rates[s.name] = append(rates[s.name], r)
		}
	}
	return rates, nil
}

// bestRates is each side's best rate.
func bestRates(rates map[string][]float64) map[string]float64 {
	out := map[string]float64{}
	for name, rs := range rates {
		out[name] = slices.Max(rs)
	}
	return out
}

// ratioOf is the median over rounds of num's rate over den's in the same round; it prints
// the per-round ratios under key.
func ratioOf(rates map[string][]float64, key, num, den string) float64 {
	return median(ratiosOf(rates, key, num, den))
}

// ratiosOf is num's rate over den's in each round; it prints them under key.
func ratiosOf(rates map[string][]float64, key, num, den string) []float64 {
	per := make([]float64, len(rates[num]))
	parts := make([]string, len(per))
	for i := range per {
		per[i] = rates[num][i] / rates[den][i]
		parts[i] = fmt.Sprintf("%.2f", per[i])
	}
	fmt.Printf("   %-40s per round: %s\n", key, strings.Join(parts, " "))
	return per
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
