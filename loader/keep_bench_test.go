package loader

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// BenchmarkScanKeepMemory reports the index's heap bytes per entry of a
// 20k-line manifest (90-byte captions, img2dataset-like 60-byte urls and an
// integer label) without --keep and with url,json:label.
func BenchmarkScanKeepMemory(b *testing.B) {
	const n = 20000
	dir := b.TempDir()
	writeFile(b, filepath.Join(dir, "a.jpg"), []byte("img"))
	var sb strings.Builder
	for i := range n {
		fmt.Fprintf(&sb, `{"id":"%08d","image":"a.jpg","text":"%s","url":"https://images.example.com/photos/2024/%08d/original.jpg","label":%d}`+"\n",
			i, strings.Repeat("w", 90), i, i%1000)
	}
	manifest := filepath.Join(dir, "m.jsonl")
	writeFile(b, manifest, []byte(sb.String()))
	for _, keep := range []string{"", "url,json:label"} {
		name := "keep=none"
		if keep != "" {
			name = "keep=" + keep
		}
		b.Run(name, func(b *testing.B) {
			opts := DefaultOptions()
			var err error
			if opts.Keep, err = ParseKeep(keep); err != nil {
				b.Fatal(err)
			}
			var perEntry float64
			for b.Loop() {
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				ix, err := BuildIndex(context.Background(), manifest, opts)
				if err != nil {
					b.Fatal(err)
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				perEntry = float64(after.HeapAlloc-before.HeapAlloc) / float64(ix.Len())
				runtime.KeepAlive(ix)
				ix.Close()
			}
			b.ReportMetric(perEntry, "B/entry")
		})
	}
}
