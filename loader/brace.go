package loader

import (
	"fmt"
	"strconv"
	"strings"
)

// maxBraceExpansion bounds how many paths one brace pattern may name.
const maxBraceExpansion = 1 << 20

// expandBraces expands WebDataset-style brace patterns: "{000000..000099}"
// (an inclusive decimal range, zero-padded to the width of its first bound
// when that has a leading zero), "{a,b,c}" (alternatives), several groups in
// one pattern, in order. Nested groups are not supported. A pattern without
// braces is returned as is.
func expandBraces(pattern string) ([]string, error) {
	open := strings.IndexByte(pattern, '{')
	if open < 0 {
		if strings.IndexByte(pattern, '}') >= 0 {
			return nil, fmt.Errorf("%w: unbalanced '}' in %q", ErrUnknownFormat, pattern)
		}
		return []string{pattern}, nil
	}
	end := strings.IndexByte(pattern[open:], '}')
	if end < 0 {
		return nil, fmt.Errorf("%w: unbalanced '{' in %q", ErrUnknownFormat, pattern)
	}
	body := pattern[open+1 : open+end]
	if strings.IndexByte(body, '{') >= 0 {
		return nil, fmt.Errorf("%w: nested braces in %q", ErrUnknownFormat, pattern)
	}
	alts, err := braceAlternatives(body)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %v", ErrUnknownFormat, pattern, err)
	}
	rest, err := expandBraces(pattern[open+end+1:])
	if err != nil {
		return nil, err
	}
	if len(alts)*len(rest) > maxBraceExpansion {
		return nil, fmt.Errorf("%w: %q names more than %d paths", ErrUnknownFormat, pattern, maxBraceExpansion)
	}
	out := make([]string, 0, len(alts)*len(rest))
	for _, a := range alts {
		for _, r := range rest {
			out = append(out, pattern[:open]+a+r)
		}
	}
	return out, nil
}

// braceAlternatives expands the inside of one group: "lo..hi" or "a,b".
func braceAlternatives(body string) ([]string, error) {
	lo, hi, isRange := strings.Cut(body, "..")
	if !isRange {
		if !strings.Contains(body, ",") {
			return nil, fmt.Errorf("brace group {%s} is neither a range nor a list", body)
		}
		return strings.Split(body, ","), nil
	}
	a, errA := strconv.Atoi(lo)
	b, errB := strconv.Atoi(hi)
	if errA != nil || errB != nil || a < 0 || b < a {
		return nil, fmt.Errorf("range {%s} wants non-negative integers lo..hi with lo <= hi", body)
	}
	if b-a >= maxBraceExpansion {
		return nil, fmt.Errorf("range {%s} names more than %d paths", body, maxBraceExpansion)
	}
	width := 0
	if len(lo) > 1 && lo[0] == '0' {
		width = len(lo)
	}
	out := make([]string, 0, b-a+1)
	for i := a; i <= b; i++ {
		out = append(out, fmt.Sprintf("%0*d", width, i))
	}
	return out, nil
}
