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
