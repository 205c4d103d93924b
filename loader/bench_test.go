package loader

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// manifestCorpus writes a manifest of n lines over 1,000 small image files
// in 10 folders and returns its path.
func manifestCorpus(b *testing.B, n int) string {
	b.Helper()
	dir := b.TempDir()
	for i := range 1000 {
		writeFile(b, filepath.Join(dir, "img", fmt.Sprint(i%10), fmt.Sprintf("%04d.jpg", i)), []byte("jpeg"))
	}
	f, err := os.Create(filepath.Join(dir, "manifest.jsonl"))
	must(b, err)
	w := bufio.NewWriter(f)
	for i := range n {
		fmt.Fprintf(w, `{"id":"s%d","image":"img/%d/%04d.jpg","text":"a photo of a cat number %d sitting on a wooden table near the window"}`+"\n",
			i, i%1000%10, i%1000, i)
	}
	must(b, w.Flush())
	must(b, f.Close())
	return f.Name()
}

// BenchmarkScanManifest measures indexing speed (no image bytes read).
// 1,000,000 lines take lines × ns/line.
func BenchmarkScanManifest(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("lines=%d", n), func(b *testing.B) {
			path := manifestCorpus(b, n)
			b.ReportAllocs()
			for b.Loop() {
				ix, err := BuildIndex(context.Background(), path, Options{})
				if err != nil || ix.Len() != n {
					b.Fatalf("index %v entries, err %v", ix, err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/line")
		})
	}
}

// BenchmarkPermutation measures epoch-order cost.
func BenchmarkPermutation(b *testing.B) {
	for _, n := range []int{4096, 1_000_000} {
		b.Run(fmt.Sprintf("samples=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_ = Permutation(n, 1, 2)
			}
		})
	}
}
