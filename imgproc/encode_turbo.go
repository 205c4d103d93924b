//go:build (turbojpeg || turbojpeg3) && cgo

package imgproc

/*
#include <stdlib.h>
#include <turbojpeg.h>
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"
	"unsafe"
)

// tjCompressor owns one TurboJPEG compressor, reused through tjCompressors
// and destroyed by a finalizer when the pool drops it.
type tjCompressor struct{ h C.tjhandle }

var tjCompressors = sync.Pool{New: func() any {
	t := &tjCompressor{h: C.tjInitCompress()}
	if t.h == nil {
		return nil
	}
	runtime.SetFinalizer(t, func(t *tjCompressor) { C.tjDestroy(t.h) })
	return t
}}

// turboEncode compresses packed RGB with libjpeg-turbo, 4:4:4, accurate DCT.
func turboEncode(rgb []byte, h, w, quality int) ([]byte, bool, error) {
	t, _ := tjCompressors.Get().(*tjCompressor)
	if t == nil {
		return nil, false, nil
	}
	defer tjCompressors.Put(t)
	var out *C.uchar
	var size C.ulong
	rc := C.tjCompress2(t.h, (*C.uchar)(unsafe.Pointer(&rgb[0])), C.int(w), 0, C.int(h), C.TJPF_RGB,
		&out, &size, C.TJSAMP_444, C.int(quality), C.TJFLAG_ACCURATEDCT)
	runtime.KeepAlive(rgb)
	if out != nil {
		defer C.tjFree(out)
	}
	if rc != 0 {
		return nil, true, fmt.Errorf("imgproc: encode jpeg: %s", C.GoString(C.tjGetErrorStr2(t.h)))
	}
	return C.GoBytes(unsafe.Pointer(out), C.int(size)), true, nil
}
