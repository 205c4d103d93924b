// Package reportcheck compares the numbers a rendered balance report page
// shows with the JSON report they come from. The page marks every such number
// with data-key, the value's path in the JSON (dot-separated object keys and
// array indices; "live.step.E.S.field.R" names field[R] of the live step with
// epoch E and step S). Values returns what the page shows; Compare checks each
// shown number equals the JSON value to the precision it is printed with.
//
// It reads a serialised page (a file, or a browser's DOM dump after scripts
// ran), not a live DOM, and is used by the balancer's and the browser tests.
package reportcheck

import (
	"encoding/json"
	"fmt"
	"html"
	"math"
	"regexp"
	"strconv"
	"strings"
)

var keyed = regexp.MustCompile(`data-key="([^"]+)"[^>]*>([^<]*)<`)

// Values returns the text of every data-key element of page, by key (the
// last one wins when a key repeats).
func Values(page string) map[string]string {
	out := map[string]string{}
	for _, m := range keyed.FindAllStringSubmatch(page, -1) {
		out[html.UnescapeString(m[1])] = strings.TrimSpace(html.UnescapeString(m[2]))
	}
	return out
}

// Compare checks every data-key value of page against report (the JSON
// object) and returns how many it checked. A value differs when it is further
// from the JSON number than half a unit of its last printed digit.
func Compare(page string, report []byte) (int, error) {
	var root any
	if err := json.Unmarshal(report, &root); err != nil {
		return 0, fmt.Errorf("reportcheck: report JSON: %w", err)
	}
	vals := Values(page)
	var errs []string
	for key, text := range vals {
		want, err := Lookup(root, key)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		got, tol, err := parseShown(text)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", key, err))
			continue
		}
		if math.Abs(got-want) > tol {
			errs = append(errs, fmt.Sprintf("%s: page shows %q, report has %v", key, text, want))
		}
	}
	if len(errs) > 0 {
		return len(vals), fmt.Errorf("reportcheck: %d of %d values differ:\n  %s", len(errs), len(vals), strings.Join(errs, "\n  "))
	}
	return len(vals), nil
}

// Lookup resolves a data-key path in a decoded JSON value to a number.
func Lookup(root any, key string) (float64, error) {
	parts := strings.Split(key, ".")
	cur := root
	for i := 0; i < len(parts); i++ {
		p := parts[i]
		if p == "step" && i+2 < len(parts) && i > 0 && parts[i-1] == "live" {
			st, err := liveStep(cur, parts[i+1], parts[i+2])
			if err != nil {
				return 0, fmt.Errorf("%s: %w", key, err)
			}
			cur, i = st, i+2
			continue
		}
		switch c := cur.(type) {
		case map[string]any:
			v, ok := c[p]
			if !ok {
				return 0, fmt.Errorf("%s: no %q in the report", key, p)
			}
			cur = v
		case []any:
			n, err := strconv.Atoi(p)
			if err != nil || n < 0 || n >= len(c) {
				return 0, fmt.Errorf("%s: index %q outside %d elements", key, p, len(c))
			}
			cur = c[n]
		default:
			return 0, fmt.Errorf("%s: %q is not an object or array", key, strings.Join(parts[:i], "."))
		}
	}
	f, ok := cur.(float64)
	if !ok {
		return 0, fmt.Errorf("%s: %v is not a number", key, cur)
	}
	return f, nil
}

// liveStep finds live.steps[k] with the given epoch and step; cur is "live".
func liveStep(cur any, epoch, step string) (any, error) {
	live, _ := cur.(map[string]any)
	steps, _ := live["steps"].([]any)
	for _, s := range steps {
		m, _ := s.(map[string]any)
		if fmt.Sprint(m["epoch"]) == epoch && fmt.Sprint(m["step"]) == step {
			return m, nil
		}
	}
	return nil, fmt.Errorf("no live step epoch %s step %s among %d", epoch, step, len(steps))
}

// parseShown parses a printed number and returns half a unit of its last digit.
func parseShown(text string) (v, tol float64, err error) {
	t := strings.TrimRight(strings.TrimSpace(text), "×%")
	v, err = strconv.ParseFloat(t, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("%q is not a number", text)
	}
	mant, exp := t, 0
	if i := strings.IndexAny(t, "eE"); i >= 0 {
		mant = t[:i]
		exp, _ = strconv.Atoi(t[i+1:])
	}
	dec := 0
	if i := strings.IndexByte(mant, '.'); i >= 0 {
		dec = len(mant) - i - 1
	}
	return v, 0.5*math.Pow(10, float64(exp-dec))*1.0001 + 1e-12, nil
}
