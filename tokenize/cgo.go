package tokenize

// The static library built by `make build` (scripts/build-tokenizers.sh) lives in
// build/lib at the repository root. Naming it here lets plain `go build` and `go test`
// link without extra environment once the library is built.

// #cgo LDFLAGS: -L${SRCDIR}/../build/lib
import "C"
