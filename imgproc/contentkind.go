package imgproc

import (
	"bytes"
	"unicode/utf8"
)

// contentKinds name what common non-image content starts with.
var contentKinds = []struct {
	magic, kind string
}{
	{"%PDF-", "PDF"},
	{"\x1f\x8b", "gzip"},
	{"PK\x03\x04", "zip"},
	{"BZh", "bzip2"},
	{"\xfd7zXZ\x00", "xz"},
	{"\x28\xb5\x2f\xfd", "zstd"},
	{"\x7fELF", "ELF executable"},
	{"RIFF", "RIFF (not WebP)"},
	{"\x00\x00\x01\x00", "ICO"},
	{"PAR1", "Parquet"},
}

// contentKind names the kind of content that is no supported image, for an
// error message: only a type name, never the content's own bytes (a file the
// loader was pointed at may hold anything, a password file included).
func contentKind(data []byte) string {
	head := data[:min(len(data), 512)]
	for _, k := range contentKinds {
		if bytes.HasPrefix(head, []byte(k.magic)) {
			return k.kind
		}
	}
	if len(head) >= 12 && string(head[4:8]) == "ftyp" {
		return "ISO media (HEIC, AVIF or video)"
	}
	if len(data) > 262 && string(data[257:262]) == "ustar" {
		return "tar"
	}
	if !isText(head) {
		return "binary"
	}
	switch t := bytes.TrimLeft(head, " \t\r\n\ufeff"); {
	case bytes.HasPrefix(t, []byte("<?xml")), bytes.HasPrefix(t, []byte("<svg")):
		return "XML or SVG text"
	case bytes.HasPrefix(t, []byte("<")):
		return "HTML text"
	case bytes.HasPrefix(t, []byte("{")), bytes.HasPrefix(t, []byte("[")):
		return "JSON text"
	}
	return "text"
}

// isText reports whether head is UTF-8 without control characters other
// than tab, newline and carriage return (a rune cut at the end is allowed).
func isText(head []byte) bool {
	for i := 0; i < len(head); {
		r, n := utf8.DecodeRune(head[i:])
		if r == utf8.RuneError && n == 1 && len(head)-i >= utf8.UTFMax {
			return false
		}
		if r < 0x20 && r != '\t' && r != '\n' && r != '\r' || r == 0x7f {
			return false
		}
		i += n
	}
	return true
}
