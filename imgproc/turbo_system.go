//go:build turbojpeg && !turbojpeg3 && cgo

package imgproc

// The system's libturbojpeg (Debian libturbojpeg0-dev: libjpeg-turbo 2.1.5 on bookworm).

// #cgo LDFLAGS: -lturbojpeg
import "C"
