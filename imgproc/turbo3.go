//go:build turbojpeg3 && cgo

package imgproc

// libjpeg-turbo 3.x built from source by scripts/build-libjpeg-turbo.sh into build/ at the
// repository root (`make build`), linked statically. Its include directory comes first, so
// its turbojpeg.h is used even where a system one exists.

// #cgo CFLAGS: -I${SRCDIR}/../build/libjpeg-turbo/include
// #cgo LDFLAGS: ${SRCDIR}/../build/libjpeg-turbo/lib/libturbojpeg.a
import "C"
