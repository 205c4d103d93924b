package imgproc

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/jpeg"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"
)

// photoLike draws smooth gradients, a periodic texture and hashed noise, so
// JPEG sizes resemble photographs rather than flat synthetic images.
func photoLike(w, h int) *image.RGBA {
	m := image.NewRGBA(image.Rect(0, 0, w, h))
	for y := range h {
		for x := range w {
			n := uint32(x*73856093^y*19349663) % 23
			t := 30 * math.Sin(0.05*float64(x)+0.03*float64(y))
			m.SetRGBA(x, y, color.RGBA{
				clampF(60 + 150*float64(x)/float64(w) + t + float64(n)),
				clampF(200 - 120*float64(y)/float64(h) + t/2 + float64(n)),
				clampF(100 + 50*math.Cos(0.01*float64(x*y)) + float64(n)), 255})
		}
	}
	return m
}

// cpuTime is the process's user+system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func clampF(v float64) uint8 { return uint8(min(max(v, 0), 255)) }

// BenchmarkProcess measures one image through decode + shorter-crop 224 +
// float16, on one goroutine, for generated inputs of several formats.
func BenchmarkProcess(b *testing.B) {
	cases := []struct {
		format string
		w, h   int
	}{
		{"jpeg", 1440, 720},
		{"jpeg", 640, 480},
		{"png", 640, 480},
	}
	for _, tc := range cases {
		var buf bytes.Buffer
		m := photoLike(tc.w, tc.h)
		var err error
		if tc.format == "jpeg" {
			err = jpeg.Encode(&buf, m, &jpeg.Options{Quality: 90})
		} else {
			err = png.Encode(&buf, m)
		}
		if err != nil {
			b.Fatal(err)
		}
		for _, dtype := range []string{DTypeFloat16, DTypeUint8} {
			b.Run(fmt.Sprintf("format=%s/size=%dx%d/dtype=%s", tc.format, tc.w, tc.h, dtype), func(b *testing.B) {
				c := DefaultConfig()
				c.DType = dtype
				p, err := NewProcessor(c)
				if err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.SetBytes(int64(buf.Len()))
				for b.Loop() {
					if _, err := p.Process(buf.Bytes()); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkThroughput processes every file under $MMFEED_BENCH_DIR (read
// into memory first) per iteration and reports img/s, to compare with
// `scripts/pillow_peer.py bench --dir $MMFEED_BENCH_DIR` on the same files.
// Run with -cpu 1 for the one-core figure. MMFEED_BENCH_DRAFT=G selects
// DecodeFast with JPEGDraftGap G (default: DecodeExact, the full-size decode
// torchvision does).
func BenchmarkThroughput(b *testing.B) {
	dir := os.Getenv("MMFEED_BENCH_DIR")
	if dir == "" {
		b.Skip("set MMFEED_BENCH_DIR to a folder of images")
	}
	var blobs [][]byte
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && !slices.Contains([]string{".json", ".jsonl", ".txt"}, filepath.Ext(p)) {
			if data, err := os.ReadFile(p); err == nil {
				blobs = append(blobs, data)
			}
		}
		return nil
	})
	if len(blobs) == 0 {
		b.Fatalf("no files under %s", dir)
	}
	c := DefaultConfig()
	if v := os.Getenv("MMFEED_BENCH_DRAFT"); v != "" {
		c.Decode = DecodeFast
		fmt.Sscan(v, &c.JPEGDraftGap)
	}
	p, err := NewProcessor(c)
	if err != nil {
		b.Fatal(err)
	}
	b.Run(fmt.Sprintf("files=%d/draft=%g/turbo=%t", len(blobs), c.draftGap(), haveTurbo), func(b *testing.B) {
		b.ReportAllocs()
		start, cpu0 := time.Now(), cpuTime()
		n := 0
		for b.Loop() {
			for _, d := range blobs {
				p.Process(d) // undecodable files count, as in the peer
				n++
			}
		}
		b.ReportMetric(float64(n)/time.Since(start).Seconds(), "img/s")
		// CPU time (user+sys, all threads incl. GC) is far less sensitive
		// to other processes on a shared machine than wall time.
		b.ReportMetric(float64(n)/(cpuTime()-cpu0).Seconds(), "img/cpu-s")
	})
}
