package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"

	"github.com/mmfeed/mmfeed/imgproc"
)

var allowGoJPEG = flag.Bool("allow-go-jpeg", false,
	"imgproc: measure even when the pure-Go JPEG decoder is built (go run without make's -tags); its ratios against Pillow's libjpeg-turbo are not the product's")

// jpegLibraryVersion is the libjpeg-turbo version this build decodes JPEGs with, as
// major × 1,000,000 + minor × 1,000 + patch (3.1.2: 3001002), or 0 for Go's image/jpeg.
// Every run records it (jpeg_libjpeg_turbo_version), so a ratio from the pure-Go build
// (`go run ./bench` or `go test` without make, which set the build tag) can be told from
// a real one.
func jpegLibraryVersion(lib string) float64 {
	v, ok := strings.CutPrefix(lib, "libjpeg-turbo ")
	if !ok {
		return 0
	}
	n := 0
	for _, part := range strings.Split(v, ".") {
		d, err := strconv.Atoi(part)
		if err != nil {
			return 0
		}
		n = n*1000 + d
	}
	return float64(n)
}

// requireTurbo refuses the imgproc section on the pure-Go build unless -allow-go-jpeg:
// its figures would be written under the same keys as the libjpeg-turbo build's.
func requireTurbo() error {
	lib := imgproc.JPEGLibrary()
	if jpegLibraryVersion(lib) > 0 || *allowGoJPEG {
		return nil
	}
	return fmt.Errorf("imgproc: this build decodes JPEGs with %s, not libjpeg-turbo (Pillow's decoder): run `make bench` (it sets -tags=turbojpeg3) or pass -allow-go-jpeg to measure it anyway", lib)
}
