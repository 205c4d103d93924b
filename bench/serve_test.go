package main

import (
	"math"
	"testing"
)

// benchTransportOutput is a -test.bench run of one mode, with the metrics
// BenchmarkTransport reports since issue 21 and a rows=4 line before it.
const benchTransportOutput = `goos: linux
BenchmarkTransport/mode=raw/ranks=2/rows=4/mib=1.2-2          	      40	   1500000 ns/op	1600.00 MB/s	         3.10 cpu-ms/op	        20.00 csw/op	       150.0 faults/op	 5000000 B/op	      50 allocs/op
BenchmarkTransport/mode=raw/ranks=2/rows=32/mib=9.2-2         	      40	  13732305 ns/op	1403.73 MB/s	        24.71 cpu-ms/op	        53.15 csw/op	      1347 faults/op	42445816 B/op	     120 allocs/op
BenchmarkTransport/mode=raw-hot/ranks=2/rows=32/mib=9.2-2     	      40	  12000000 ns/op	1600.50 MB/s	        22.00 cpu-ms/op	        50.00 csw/op	      1100 faults/op	42445816 B/op	     120 allocs/op
PASS
`

func TestParseTransportRate(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want float64
		ok   bool
	}{
		{"raw", 1403.73, true},         // the rows=32 line, not rows=4
		{"raw-hot", 1600.50, true},     // a mode whose name has a dash
		{"core", 0, false},             // absent
		{"jetstream-memory", 0, false}, // absent
	} {
		got, err := parseTransportRate([]byte(benchTransportOutput), tc.mode)
		if (err == nil) != tc.ok || math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("parseTransportRate(%s) = %v, %v; want %v, ok=%v", tc.mode, got, err, tc.want, tc.ok)
		}
	}
}

func TestRatiosOf(t *testing.T) {
	rates := map[string][]float64{"core": {80, 90, 100, 70, 95}, "raw": {100, 100, 100, 100, 100}}
	got := ratiosOf(rates, "k", "core", "raw")
	want := []float64{0.8, 0.9, 1.0, 0.7, 0.95}
	for i := range want {
		if math.Abs(got[i]-want[i]) > 1e-12 {
			t.Fatalf("ratiosOf = %v, want %v", got, want)
		}
	}
	if m := median(got); math.Abs(m-0.9) > 1e-12 {
		t.Errorf("median = %v, want 0.9", m)
	}
	if m := ratioOf(rates, "k", "core", "raw"); math.Abs(m-0.9) > 1e-12 {
		t.Errorf("ratioOf = %v, want 0.9", m)
	}
}
