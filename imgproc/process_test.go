package imgproc

import (
	"bytes"
	"errors"
	"image/jpeg"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
)

func sentinel(err error) error {
	for _, s := range []error{ErrEmpty, ErrTooLarge, ErrUnsupported, ErrCorrupt} {
		if errors.Is(err, s) {
			return s
		}
	}
	return nil
}

func TestProcessHostile(t *testing.T) {
	imgs := encoded(t)
	var jpg bytes.Buffer
	if err := jpeg.Encode(&jpg, testImage(64, 48, false), nil); err != nil {
		t.Fatal(err)
	}
	garbage := make([]byte, 4096)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range garbage {
		garbage[i] = byte(rng.Uint32())
	}
	jpegBomb := append([]byte{}, jpg.Bytes()...)
	// Patch the SOF0 height/width to 60000x60000.
	if i := bytes.Index(jpegBomb, []byte{0xFF, 0xC0}); i > 0 {
		copy(jpegBomb[i+5:], []byte{0xEA, 0x60, 0xEA, 0x60})
	} else {
		t.Fatal("no SOF0 in Go's JPEG")
	}
	small := DefaultConfig()
	small.MaxFileBytes = 1000
	cases := []struct {
		name string
		cfg  Config
		data []byte
		want error
	}{
		{"zero bytes", DefaultConfig(), nil, ErrEmpty},
		{"garbage", DefaultConfig(), garbage, ErrUnsupported},
		{"text named jpg", DefaultConfig(), []byte("this is not an image\n"), ErrUnsupported},
		{"svg", DefaultConfig(), []byte(`<svg xmlns="http://www.w3.org/2000/svg"/>`), ErrUnsupported},
		{"jpeg magic only", DefaultConfig(), []byte{0xFF, 0xD8, 0xFF}, ErrCorrupt},
		{"truncated jpeg", DefaultConfig(), jpg.Bytes()[:jpg.Len()/2], ErrCorrupt},
		{"truncated png", DefaultConfig(), imgs["go.png"][:len(imgs["go.png"])*2/3], ErrCorrupt},
		{"truncated gif", DefaultConfig(), imgs["go.gif"][:len(imgs["go.gif"])/2], ErrCorrupt},
		{"truncated webp", DefaultConfig(), imgs["seed_lossy.webp"][:200], ErrCorrupt},
		{"truncated tiff", DefaultConfig(), imgs["seed_lzw.tif"][:300], ErrCorrupt},
		{"png header only", DefaultConfig(), pngHeaderOnly(100, 100), ErrCorrupt},
		{"png bomb", DefaultConfig(), pngHeaderOnly(30000, 30000), ErrTooLarge},
		{"png zero width", DefaultConfig(), pngHeaderOnly(0, 10), ErrCorrupt},
		{"jpeg bomb", DefaultConfig(), jpegBomb, ErrTooLarge},
		{"file too big", small, jpg.Bytes(), ErrTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := NewProcessor(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			_, err = p.Process(tc.data)
			if got := sentinel(err); got != tc.want {
				t.Errorf("error got %v (%v), want %v", got, err, tc.want)
			}
		})
	}
}

// TestProcessEdgeCorpus runs the shared corpus's hostile files when present.
func TestProcessEdgeCorpus(t *testing.T) {
	root := os.Getenv("MMFEED_CORPUS")
	if root == "" {
		root = "/tmp/corpus"
	}
	ents, err := os.ReadDir(filepath.Join(root, "edge"))
	if err != nil || len(ents) == 0 {
		t.Skip("no edge corpus")
	}
	p, err := NewProcessor(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		name := e.Name()
		t.Run(name, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join(root, "edge", name))
			if err != nil {
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			img, err := p.Process(data)
			runtime.ReadMemStats(&after)
			var want error
			switch {
			case strings.HasPrefix(name, "bomb_"), strings.HasPrefix(name, "big_"):
				want = ErrTooLarge
				if d := after.TotalAlloc - before.TotalAlloc; d > 16<<20 {
					t.Errorf("rejecting a bomb allocated %d bytes", d)
				}
			case strings.HasPrefix(name, "not_an_image"):
				want = ErrUnsupported
			case strings.HasPrefix(name, "truncated"):
				want = ErrCorrupt
			}
			if got := sentinel(err); got != want {
				t.Fatalf("error got %v (%v), want %v", got, err, want)
			}
			if err == nil && img.Shape != [3]int{3, 224, 224} {
				t.Errorf("shape got %v, want [3 224 224]", img.Shape)
			}
		})
	}
}

func TestReadHeaderDoesNotAllocatePixels(t *testing.T) {
	bomb := pngHeaderOnly(50000, 50000)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	h, err := ReadHeader(bomb)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := [2]int{h.Width, h.Height}, [2]int{50000, 50000}; got != want {
		t.Errorf("size got %v, want %v", got, want)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
		t.Errorf("ReadHeader allocated %d bytes on a 2.5 GP header, want < 1 MiB", d)
	}
}

func TestReadHeader(t *testing.T) {
	imgs := encoded(t)
	var base bytes.Buffer
	if err := jpeg.Encode(&base, testImage(30, 20, false), nil); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		data     []byte
		format   string
		w, h     int
		orient   int
		bpp      int
		wantsErr error
	}{
		{"jpeg", base.Bytes(), FormatJPEG, 30, 20, 1, 24, nil},
		{"jpeg exif 6", jpegWithExif(t, base.Bytes(), 6), FormatJPEG, 20, 30, 6, 24, nil},
		{"jpeg exif 3", jpegWithExif(t, base.Bytes(), 3), FormatJPEG, 30, 20, 3, 24, nil},
		{"jpeg exif 9 invalid", jpegWithExif(t, base.Bytes(), 9), FormatJPEG, 30, 20, 1, 24, nil},
		{"pillow exif 6", imgs["seed_exif6.jpg"], FormatJPEG, 30, 40, 6, 24, nil},
		{"png", imgs["go.png"], FormatPNG, 37, 23, 1, 32, nil},
		{"gif", imgs["go.gif"], FormatGIF, 37, 23, 1, 8, nil},
		{"bmp", imgs["go.bmp"], FormatBMP, 37, 23, 1, 32, nil},
		{"tiff", imgs["go.tif"], FormatTIFF, 37, 23, 1, 32, nil},
		{"tiff gray16", imgs["seed_gray16.tif"], FormatTIFF, 40, 30, 1, 16, nil},
		{"webp", imgs["seed_lossy.webp"], FormatWebP, 40, 30, 1, 24, nil},
		{"webp anim", imgs["seed_anim.webp"], FormatWebP, 24, 16, 1, 24, nil},
		{"cmyk", imgs["seed_cmyk.jpg"], FormatJPEG, 40, 30, 1, 32, nil},
		{"empty", nil, "", 0, 0, 0, 0, ErrEmpty},
		{"unknown", []byte("GIF88a"), "", 0, 0, 0, 0, ErrUnsupported},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, err := ReadHeader(tc.data)
			if tc.wantsErr != nil {
				if !errors.Is(err, tc.wantsErr) {
					t.Fatalf("error got %v, want %v", err, tc.wantsErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := Header{Format: h.Format, Width: h.Width, Height: h.Height, Orientation: h.Orientation, BitsPerPixel: h.BitsPerPixel, FileBytes: h.FileBytes}
			want := Header{Format: tc.format, Width: tc.w, Height: tc.h, Orientation: tc.orient, BitsPerPixel: tc.bpp, FileBytes: len(tc.data)}
			if got != want {
				t.Errorf("header got %+v, want %+v", got, want)
			}
		})
	}
}

// TestProcessFormats decodes every seed format and checks the shape, grid,
// source size and that the output is not blank.
func TestProcessFormats(t *testing.T) {
	for _, dtype := range []string{DTypeFloat16, DTypeFloat32, DTypeBFloat16, DTypeUint8} {
		cfg := DefaultConfig()
		cfg.DType = dtype
		p, err := NewProcessor(cfg)
		if err != nil {
			t.Fatal(err)
		}
		for name, data := range encoded(t) {
			t.Run(dtype+"/"+name, func(t *testing.T) {
				img, err := p.Process(data)
				if err != nil {
					t.Fatal(err)
				}
				if got, want := img.Shape, [3]int{3, 224, 224}; got != want {
					t.Errorf("shape got %v, want %v", got, want)
				}
				if got, want := img.Grid, [2]int{14, 14}; got != want {
					t.Errorf("grid got %v, want %v", got, want)
				}
				if got, want := len(img.Data), 3*224*224*cfg.ElemSize(); got != want {
					t.Errorf("data len got %d, want %d", got, want)
				}
				h, _ := ReadHeader(data)
				if got, want := [2]int{img.SrcWidth, img.SrcHeight}, [2]int{h.Width, h.Height}; got != want {
					t.Errorf("src size got %v, want %v", got, want)
				}
				if img.Complexity <= 0 || img.Complexity > 1 {
					t.Errorf("complexity got %v, want in (0, 1]", img.Complexity)
				}
			})
		}
	}
}

// TestProcessConcurrent checks that concurrent calls give the same bytes as
// serial ones (run with -race).
func TestProcessConcurrent(t *testing.T) {
	p, err := NewProcessor(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	imgs := encoded(t)
	want := map[string][]byte{}
	for name, data := range imgs {
		img, err := p.Process(data)
		if err != nil {
			t.Fatal(err)
		}
		want[name] = img.Data
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for name, data := range imgs {
				img, err := p.Process(data)
				if err != nil {
					t.Errorf("goroutine %d %s: %v", g, name, err)
					return
				}
				if !bytes.Equal(img.Data, want[name]) {
					t.Errorf("goroutine %d %s: output differs from serial run", g, name)
				}
			}
		})
	}
	wg.Wait()
}

func TestProcessInto(t *testing.T) {
	p, err := NewProcessor(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	data := encoded(t)["seed_lossy.webp"]
	want, err := p.Process(data)
	if err != nil {
		t.Fatal(err)
	}
	h, err := ReadHeader(data)
	if err != nil {
		t.Fatal(err)
	}
	if got, wantN := p.TensorBytes(h.Width, h.Height), len(want.Data); got != wantN {
		t.Fatalf("TensorBytes got %d, want %d", got, wantN)
	}
	buf := make([]byte, len(want.Data)+10)
	img, err := p.ProcessInto(buf, data)
	if err != nil {
		t.Fatal(err)
	}
	if &img.Data[0] != &buf[0] || !bytes.Equal(img.Data, want.Data) {
		t.Errorf("ProcessInto did not write the same tensor into dst")
	}
	small, err := p.ProcessInto(make([]byte, 10), data)
	if err != nil || !bytes.Equal(small.Data, want.Data) {
		t.Errorf("ProcessInto with a short dst got %v, want a fresh correct tensor", err)
	}
}
