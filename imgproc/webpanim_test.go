package imgproc

import (
	"errors"
	"testing"
)

// TestAnimatedWebPFrameOutsideCanvas: a small canvas (which passes the
// MaxImagePixels check on the header) hiding a larger frame is refused as
// too large before the frame is decoded; the untouched file decodes.
func TestAnimatedWebPFrameOutsideCanvas(t *testing.T) {
	anim := encoded(t)["seed_anim.webp"]
	p, err := NewProcessor(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Process(anim); err != nil {
		t.Fatalf("the seed animation: %v", err)
	}
	small := append([]byte(nil), anim...)
	small[24], small[25], small[26] = 3, 0, 0 // canvas width 4
	small[27], small[28], small[29] = 3, 0, 0 // canvas height 4
	if h, err := ReadHeader(small); err != nil || h.Width != 4 || h.Height != 4 {
		t.Fatalf("header %+v, %v: want a 4x4 canvas", h, err)
	}
	if _, err := p.Process(small); !errors.Is(err, ErrTooLarge) {
		t.Errorf("got %v, want ErrTooLarge for a 24x16 frame on a 4x4 canvas", err)
	}
}
