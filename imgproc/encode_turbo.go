//go:build (turbojpeg || turbojpeg3) && cgo

package imgproc

/*
#include <stdlib.h>
#include <turbojpeg.h>
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// turboEncode compresses a CHW RGB tensor with libjpeg-turbo, 4:4:4, accurate DCT.
func turboEncode(chw []byte, h, w, quality int) ([]byte, bool, error) {
	t := C.tjInitCompress()
	if t == nil {
		return nil, false, nil
	}
	defer C.tjDestroy(t)
	plane := h * w
	rgb := make([]byte, 3*plane)
	for i := range plane {
		rgb[3*i], rgb[3*i+1], rgb[3*i+2] = chw[i], chw[plane+i], chw[2*plane+i]
	}
	var out *C.uchar
	var size C.ulong
	rc := C.tjCompress2(t, (*C.uchar)(unsafe.Pointer(&rgb[0])), C.int(w), 0, C.int(h), C.TJPF_RGB,
		&out, &size, C.TJSAMP_444, C.int(quality), C.TJFLAG_ACCURATEDCT)
	if out != nil {
		defer C.tjFree(out)
	}
	if rc != 0 {
		return nil, true, fmt.Errorf("imgproc: encode jpeg: %s", C.GoString(C.tjGetErrorStr2(t)))
	}
	return C.GoBytes(unsafe.Pointer(out), C.int(size)), true, nil
}
