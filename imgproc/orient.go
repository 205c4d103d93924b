package imgproc

// orient applies EXIF orientation o (1..8) to packed RGB src (w×h) as
// Pillow's ImageOps.exif_transpose does, writing into dst's capacity. It
// returns the new buffer and size; for o == 1 (or invalid) it returns src.
func orient(src []byte, w, h, o int, dst []byte) ([]byte, int, int) {
	if o < 2 || o > 8 {
		return src, w, h
	}
	ow, oh := w, h
	if o >= 5 {
		ow, oh = h, w
	}
	dst = grow(dst, len(src))
	for oy := range oh {
		for ox := range ow {
			var sx, sy int
			switch o {
			case 2: // flip left-right
				sx, sy = w-1-ox, oy
			case 3: // rotate 180
				sx, sy = w-1-ox, h-1-oy
			case 4: // flip top-bottom
				sx, sy = ox, h-1-oy
			case 5: // transpose
				sx, sy = oy, ox
			case 6: // rotate 90° clockwise (PIL ROTATE_270)
				sx, sy = oy, h-1-ox
			case 7: // transverse
				sx, sy = w-1-oy, h-1-ox
			case 8: // rotate 90° counter-clockwise (PIL ROTATE_90)
				sx, sy = w-1-oy, ox
			}
			s := 3 * (sy*w + sx)
			d := 3 * (oy*ow + ox)
			dst[d], dst[d+1], dst[d+2] = src[s], src[s+1], src[s+2]
		}
	}
	return dst, ow, oh
}
