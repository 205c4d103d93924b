//go:build !((turbojpeg || turbojpeg3) && cgo)

package imgproc

// turboEncode is absent without libjpeg-turbo: encodeRGB uses image/jpeg.
func turboEncode(rgb []byte, h, w, quality int) ([]byte, bool, error) { return nil, false, nil }
