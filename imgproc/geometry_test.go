package imgproc

import (
	"errors"
	"math"
	"testing"
)

func TestShorterCropGeometry(t *testing.T) {
	// Expected values worked by hand from torchvision's formulas:
	// long = int(224*long/short); offset = round((n-224)/2), half to even.
	cases := []struct {
		w, h           int
		rw, rh, x0, y0 int
	}{
		{500, 375, 298, 224, 37, 0},   // 224*500/375 = 298.67; (298-224)/2 = 37
		{225, 301, 224, 299, 0, 38},   // 224*301/225 = 299.66; 75/2 = 37.5 -> 38 (even)
		{375, 447, 224, 266, 0, 21},   // 224*447/375 = 267.0079.. -> 267? see below
		{1440, 720, 448, 224, 112, 0}, // exact 2:1
		{224, 224, 224, 224, 0, 0},
		{100, 100, 224, 224, 0, 0}, // upscale
		{10, 1000, 224, 22400, 0, 11088},
		{301, 224, 301, 224, 38, 0}, // 77/2 = 38.5 -> 38 (even)
	}
	// 224*447/375 = 100128/375 = 267.008 -> 267; (267-224)/2 = 21.5 -> 22.
	cases[2].rh, cases[2].y0 = 267, 22
	c := DefaultConfig()
	for _, tc := range cases {
		g, ok := c.plan(tc.w, tc.h)
		if !ok {
			t.Fatalf("plan(%d, %d) not ok", tc.w, tc.h)
		}
		got := [4]int{g.rw, g.rh, g.x0, g.y0}
		want := [4]int{tc.rw, tc.rh, tc.x0, tc.y0}
		if got != want || g.ow != 224 || g.oh != 224 {
			t.Errorf("plan(%d, %d) got %v out %dx%d, want %v out 224x224", tc.w, tc.h, got, g.ow, g.oh, want)
		}
	}
}

func TestDynamicGeometry(t *testing.T) {
	c := DefaultConfig()
	c.Policy = PolicyDynamic
	c.PatchSize = 28
	cases := []struct {
		w, h   int
		ow, oh int
	}{
		// 1920x1080: rounds to 1932x1092 > max; beta = sqrt(1920*1080/1003520)
		// = 1.4375; floor(1335.7/28)*28 = 1316, floor(751.3/28)*28 = 728.
		{1920, 1080, 1316, 728},
		// 640x480 rounds to 644x476 (23*28, 17*28) within the range.
		{640, 480, 644, 476},
		// 20x20 rounds to 28x28 = 784 < 3136: beta = sqrt(3136/400) = 2.8;
		// ceil(56/28)*28 = 56.
		{20, 20, 56, 56},
	}
	for _, tc := range cases {
		ow, oh := c.OutputSize(tc.w, tc.h)
		if ow != tc.ow || oh != tc.oh {
			t.Errorf("OutputSize(%d, %d) got %dx%d, want %dx%d", tc.w, tc.h, ow, oh, tc.ow, tc.oh)
		}
		if got, want := c.ImageTokens(tc.w, tc.h), (tc.ow/28)*(tc.oh/28); got != want {
			t.Errorf("ImageTokens(%d, %d) got %d, want %d", tc.w, tc.h, got, want)
		}
	}
	// Properties over many sizes: multiples of the patch, within bounds for
	// sane aspect ratios, aspect ratio roughly kept.
	for w := 30; w < 5000; w += 137 {
		for h := 30; h < 5000; h += 211 {
			ow, oh := c.OutputSize(w, h)
			if ow%28 != 0 || oh%28 != 0 {
				t.Fatalf("%dx%d -> %dx%d not multiples of 28", w, h, ow, oh)
			}
			if ow*oh > c.MaxPixels || ow*oh < c.MinPixels {
				t.Fatalf("%dx%d -> %dx%d = %d px outside [%d, %d]", w, h, ow, oh, ow*oh, c.MinPixels, c.MaxPixels)
			}
			r0, r1 := float64(w)/float64(h), float64(ow)/float64(oh)
			if math.Abs(math.Log(r0/r1)) > math.Log(1+56.0/float64(min(ow, oh))) {
				t.Fatalf("%dx%d -> %dx%d distorts the aspect ratio", w, h, ow, oh)
			}
		}
	}
}

func TestSquareAndTokens(t *testing.T) {
	c := DefaultConfig()
	c.Policy = PolicySquare
	c.Size = 336
	c.PatchSize = 14
	if ow, oh := c.OutputSize(1000, 10); ow != 336 || oh != 336 {
		t.Errorf("square got %dx%d, want 336x336", ow, oh)
	}
	if got, want := c.ImageTokens(1000, 10), 24*24; got != want {
		t.Errorf("tokens got %d, want %d", got, want)
	}
	if ow, oh := c.OutputSize(0, 10); ow != 0 || oh != 0 {
		t.Errorf("invalid size got %dx%d, want 0x0", ow, oh)
	}
}

func TestConfigValidate(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("default config: %v", err)
	}
	cases := []struct {
		name string
		mod  func(*Config)
	}{
		{"policy", func(c *Config) { c.Policy = "stretch" }},
		{"size", func(c *Config) { c.Size = 0 }},
		{"patch", func(c *Config) { c.PatchSize = 0 }},
		{"filter", func(c *Config) { c.Filter = "lanczos" }},
		{"norm", func(c *Config) { c.Norm = "coco" }},
		{"std zero", func(c *Config) { c.Norm = NormCustom; c.Std = [3]float32{1, 0, 1} }},
		{"dtype", func(c *Config) { c.DType = "int8" }},
		{"pixels", func(c *Config) { c.MaxImagePixels = 0 }},
		{"bytes", func(c *Config) { c.MaxFileBytes = -1 }},
		{"decode", func(c *Config) { c.Decode = "draft" }},
		{"decode empty", func(c *Config) { c.Decode = "" }},
		{"draft gap", func(c *Config) { c.Decode = DecodeFast; c.JPEGDraftGap = 0.5 }},
		{"dynamic range", func(c *Config) { c.Policy = PolicyDynamic; c.MinPixels = 10 }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.mod(&c)
			if err := c.Validate(); !errors.Is(err, ErrConfig) {
				t.Errorf("Validate got %v, want ErrConfig", err)
			}
			if _, err := NewProcessor(c); !errors.Is(err, ErrConfig) {
				t.Errorf("NewProcessor got %v, want ErrConfig", err)
			}
		})
	}
}

func TestVerticalFirst(t *testing.T) {
	// Pass order observed in Pillow 13 (each case checked against both
	// orders computed separately); ties go horizontal first.
	cases := []struct {
		w, h, rw, rh int
		want         bool
	}{
		{225, 301, 256, 256, true},  // width grows, height shrinks
		{301, 225, 256, 256, false}, // height grows
		{400, 300, 200, 100, false}, // 2*200 > 200
		{300, 400, 200, 100, true},  // 2*100 < 300
		{87, 189, 29, 63, true},     // 116 < 126
		{249, 207, 105, 10, false},  // 288 > 197
		{100, 100, 90, 80, false},   // tie 20 == 20
		{50, 60, 100, 70, false},    // both grow
		{1440, 720, 448, 224, false},
	}
	for _, tc := range cases {
		if got := verticalFirst(tc.w, tc.h, tc.rw, tc.rh); got != tc.want {
			t.Errorf("verticalFirst(%d, %d -> %d, %d) got %v, want %v", tc.w, tc.h, tc.rw, tc.rh, got, tc.want)
		}
	}
}
