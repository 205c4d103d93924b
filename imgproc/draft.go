package imgproc

import "math"

// draftScale is Pillow's JpegImageFile.draft() rule for a requested size of
// ceil(gap*tw)×ceil(gap*th): the largest of 8, 4, 2, 1 not above
// min(w // reqW, h // reqH). gap <= 0 means no scaling.
func draftScale(w, h, tw, th int, gap float64) int {
	if gap <= 0 || tw <= 0 || th <= 0 {
		return 1
	}
	rw, rh := int(math.Ceil(gap*float64(tw))), int(math.Ceil(gap*float64(th)))
	scale := min(w/max(rw, 1), h/max(rh, 1))
	for _, sc := range []int{8, 4, 2} {
		if scale >= sc {
			return sc
		}
	}
	return 1
}

// eighthsScale is DecodeReduce's DCT scale: the smallest n/8 (n in 1..8,
// every factor libjpeg-turbo's scaled IDCTs offer below 1) whose
// ceil(w*n/8)×ceil(h*n/8) result is still at least ceil(gap*tw)×ceil(gap*th).
// gap <= 0 means no scaling (8/8).
func eighthsScale(w, h, tw, th int, gap float64) int {
	if gap <= 0 || tw <= 0 || th <= 0 {
		return 8
	}
	rw, rh := int(math.Ceil(gap*float64(tw))), int(math.Ceil(gap*float64(th)))
	for n := 1; n < 8; n++ {
		if (w*n+7)/8 >= rw && (h*n+7)/8 >= rh {
			return n
		}
	}
	return 8
}

// dctScale is the num/den JPEG decode scale of Config c for a rawW×rawH
// JPEG resized to tw×th: 1/1 under DecodeExact, Pillow's 1/2, 1/4 or 1/8
// draft under DecodeFast, n/8 (eighthsScale) under DecodeReduce.
func (c Config) dctScale(rawW, rawH, tw, th int) (num, den int) {
	switch c.Decode {
	case DecodeFast:
		return 1, draftScale(rawW, rawH, tw, th, c.JPEGDraftGap)
	case DecodeReduce:
		return eighthsScale(rawW, rawH, tw, th, c.JPEGDraftGap), 8
	}
	return 1, 1
}
