//go:build !((turbojpeg || turbojpeg3) && cgo)

package imgproc

// turboEncode is absent without libjpeg-turbo: EncodeJPEG uses image/jpeg.
func turboEncode(chw []byte, h, w, quality int) ([]byte, bool, error) { return nil, false, nil }
