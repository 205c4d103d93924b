//go:build !(turbojpeg || turbojpeg3) || !cgo

package imgproc

// JPEGLibrary names the JPEG decoder this build uses.
func JPEGLibrary() string { return "Go image/jpeg" }

// haveTurbo reports whether the libjpeg-turbo fast path is compiled in.
const haveTurbo = false

// turboDecode is the pure-Go build's stub: it never handles the image.
func turboDecode(data []byte, rawW, rawH, num, den int, s *scratch) ([]byte, int, int, bool, error) {
	return nil, 0, 0, false, nil
}
