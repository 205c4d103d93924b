package loader

import (
	"encoding/json"
	"flag"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

func TestPermutationIsPermutation(t *testing.T) {
	for _, n := range []int{0, 1, 2, 7, 1000} {
		perm := Permutation(n, 42, 3)
		sorted := slices.Sorted(slices.Values(perm))
		for i, v := range sorted {
			if v != i {
				t.Fatalf("n=%d: not a permutation: %v", n, perm)
			}
		}
		if len(perm) != n {
			t.Errorf("n=%d: got len %d", n, len(perm))
		}
	}
}

func TestPermutationDeterministic(t *testing.T) {
	tests := []struct {
		name        string
		seed, epoch uint64
		same        bool
	}{
		{"same inputs", 1, 0, true},
		{"other epoch", 1, 1, false},
		{"other seed", 2, 0, false},
	}
	base := Permutation(500, 1, 0)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Permutation(500, tt.seed, tt.epoch)
			if slices.Equal(got, base) != tt.same {
				t.Errorf("equal to (seed 1, epoch 0): got %v, want %v", !tt.same, tt.same)
			}
		})
	}
}

// TestPermutationUniform checks every position receives every element with
// roughly equal frequency (chi-square, 3x3 table).
func TestPermutationUniform(t *testing.T) {
	const n, trials = 3, 30000
	var counts [n][n]int
	for e := range uint64(trials) {
		for pos, v := range Permutation(n, 9, e) {
			counts[pos][v]++
		}
	}
	exp := float64(trials) / n
	chi := 0.0
	for _, row := range counts {
		for _, c := range row {
			chi += (float64(c) - exp) * (float64(c) - exp) / exp
		}
	}
	if chi > 30 { // 4 degrees of freedom: p < 1e-5
		t.Errorf("chi-square %.1f too large: %v", chi, counts)
	}
}

// TestPermutationGolden pins the algorithm: other languages reproduce it
// from testdata/permutation.golden.json (refresh with -update).
func TestPermutationGolden(t *testing.T) {
	type gold struct {
		N     int    `json:"n"`
		Seed  uint64 `json:"seed"`
		Epoch uint64 `json:"epoch"`
		Perm  []int  `json:"perm"`
	}
	var got []gold
	for _, c := range [][3]uint64{{10, 0, 0}, {10, 1234, 7}, {37, 1<<63 + 5, 1 << 40}} {
		got = append(got, gold{int(c[0]), c[1], c[2], Permutation(int(c[0]), c[1], c[2])})
	}
	path := filepath.Join("testdata", "permutation.golden.json")
	data, _ := json.MarshalIndent(got, "", " ")
	if *update {
		must(t, os.MkdirAll("testdata", 0o755))
		must(t, os.WriteFile(path, append(data, '\n'), 0o644))
	}
	want, err := os.ReadFile(path)
	must(t, err)
	if strings.TrimSpace(string(want)) != string(data) {
		t.Errorf("permutations changed; got\n%s\nwant\n%s", data, want)
	}
}

// pythonPermutation is the reference re-implementation from order.go's
// comment.
const pythonPermutation = `
import json, sys
M = (1 << 64) - 1
G = 0x9E3779B97F4A7C15
def mix(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
    return z ^ (z >> 31)
def perm(n, seed, epoch):
    st = mix(seed ^ mix((epoch + G) & M))
    p = list(range(n))
    for i in range(n - 1, 0, -1):
        st = (st + G) & M
        j = (mix(st) * (i + 1)) >> 64
        p[i], p[j] = p[j], p[i]
    return p
cases = json.load(sys.stdin)
print(json.dumps([perm(n, s, e) for n, s, e in cases]))
`

// TestPermutationPython checks the documented algorithm reproduces in
// Python (skipped when no interpreter is configured).
func TestPermutationPython(t *testing.T) {
	py := os.Getenv("MMFEED_PYTHON")
	if py == "" {
		py = filepath.Join("..", ".venv", "bin", "python")
	}
	if _, err := os.Stat(py); err != nil {
		t.Skipf("no python at %s (set MMFEED_PYTHON)", py)
	}
	cases := [][3]uint64{{1, 0, 0}, {50, 7, 2}, {1000, 1<<64 - 1, 12345}}
	in, _ := json.Marshal(cases)
	cmd := exec.Command(py, "-c", pythonPermutation)
	cmd.Stdin = strings.NewReader(string(in))
	out, err := cmd.Output()
	must(t, err)
	var got [][]int
	must(t, json.Unmarshal(out, &got))
	for i, c := range cases {
		if want := Permutation(int(c[0]), c[1], c[2]); !slices.Equal(got[i], want) {
			t.Errorf("case %v: python %v, go %v", c, got[i][:min(10, len(got[i]))], want[:min(10, len(want))])
		}
	}
}
