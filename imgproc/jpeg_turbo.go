//go:build (turbojpeg || turbojpeg3) && cgo

package imgproc

// Which libjpeg-turbo is linked is chosen by the build tag: turbojpeg3 links the
// libjpeg-turbo 3.x that `make build` compiles from source (turbo3.go), turbojpeg the
// system's libturbojpeg (turbo_system.go). The code is the same: TurboJPEG 2.x API.

/*
#include <stdlib.h>
#include <jconfig.h>
#include <turbojpeg.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// JPEGLibrary names the JPEG decoder this build uses, with the libjpeg-turbo version its
// headers declare.
func JPEGLibrary() string {
	n := int(C.LIBJPEG_TURBO_VERSION_NUMBER)
	return fmt.Sprintf("libjpeg-turbo %d.%d.%d", n/1000000, n/1000%1000, n%1000)
}

// haveTurbo reports whether the libjpeg-turbo fast path is compiled in.
const haveTurbo = true

// tjHandle owns one TurboJPEG decompressor; it lives in a pooled scratch
// and is destroyed by a finalizer when the pool drops the scratch.
type tjHandle struct{ h C.tjhandle }

func newTJHandle() *tjHandle {
	t := &tjHandle{h: C.tjInitDecompress()}
	if t.h == nil {
		return nil
	}
	runtime.SetFinalizer(t, func(t *tjHandle) { C.tjDestroy(t.h) })
	return t
}

// turboDecode decodes a YCbCr or grayscale JPEG to packed RGB with
// libjpeg-turbo (accurate integer IDCT, fancy upsampling: what Pillow
// gets), scaled in the DCT domain by num/den (Config.dctScale: 1/1 exact,
// Pillow's draft() 1/2, 1/4 or 1/8 for DecodeFast, n/8 for DecodeReduce) to
// ceil(rawW*num/den)×ceil(rawH*num/den).
// ok is false, and the caller falls back to the Go decoder (which
// classifies errors), for CMYK/YCCK images, warnings and errors.
func turboDecode(data []byte, rawW, rawH, num, den int, s *scratch) ([]byte, int, int, bool, error) {
	if len(data) == 0 {
		return nil, 0, 0, false, nil
	}
	t, _ := s.turboState.(*tjHandle)
	if t == nil {
		if t = newTJHandle(); t == nil {
			return nil, 0, 0, false, nil
		}
		s.turboState = t
	}
	src := (*C.uchar)(unsafe.Pointer(&data[0]))
	n := C.ulong(len(data))
	var w, h, sub, cs C.int
	if C.tjDecompressHeader3(t.h, src, n, &w, &h, &sub, &cs) != 0 {
		return nil, 0, 0, false, nil
	}
	if int(w) != rawW || int(h) != rawH || (cs != C.TJCS_YCbCr && cs != C.TJCS_GRAY && cs != C.TJCS_RGB) {
		return nil, 0, 0, false, nil
	}
	ow, oh := (rawW*num+den-1)/den, (rawH*num+den-1)/den
	s.turbo = grow(s.turbo, 3*ow*oh)
	dst := (*C.uchar)(unsafe.Pointer(&s.turbo[0]))
	flags := C.int(C.TJFLAG_ACCURATEDCT | C.TJFLAG_STOPONWARNING | C.TJFLAG_LIMITSCANS)
	if C.tjDecompress2(t.h, src, n, dst, C.int(ow), C.int(3*ow), C.int(oh), C.TJPF_RGB, flags) != 0 {
		return nil, 0, 0, false, nil
	}
	runtime.KeepAlive(data)
	return s.turbo, ow, oh, true, nil
}
