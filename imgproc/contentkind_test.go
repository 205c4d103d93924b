package imgproc

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestUnknownContentNamesTypeOnly: content that is no supported image is
// refused with ErrUnsupported and a message that names the detected kind of
// content, never its bytes (an /etc/shadow read under --allow-absolute-paths
// must not land in quarantine.jsonl, neither raw nor in hex).
func TestUnknownContentNamesTypeOnly(t *testing.T) {
	tar := make([]byte, 1024)
	copy(tar, "secret.txt")
	copy(tar[257:], "ustar\x0000")
	for _, c := range []struct {
		name string
		data []byte
		kind string
	}{
		{"shadow file", []byte("root:*:20000:0:99999:7:::\ndaemon:*:20000:0:99999:7:::\n"), "(content: text)"},
		{"html", []byte("  <html><body>hunter2</body></html>"), "(content: HTML text)"},
		{"svg", []byte(`<?xml version="1.0"?><svg/>`), "(content: XML or SVG text)"},
		{"json", []byte(`{"password":"hunter2"}`), "(content: JSON text)"},
		{"pdf", []byte("%PDF-1.7 secret"), "(content: PDF)"},
		{"gzip", []byte("\x1f\x8b\x08\x00secretsecret"), "(content: gzip)"},
		{"heic", []byte("\x00\x00\x00\x18ftypheic\x00\x00\x00\x00"), "(content: ISO media"},
		{"tar", tar, "(content: tar)"},
		{"binary", []byte{0x01, 0x02, 0xfe, 0x80, 0x00, 0x99, 0x42, 0x13, 0x37}, "(content: binary)"},
		{"unknown GIF version", []byte("GIF88a"), "(content: text)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadHeader(c.data)
			if !errors.Is(err, ErrUnsupported) {
				t.Fatalf("got %v, want ErrUnsupported", err)
			}
			msg := err.Error()
			if !strings.Contains(msg, c.kind) {
				t.Errorf("message %q does not name %q", msg, c.kind)
			}
			if leaks(msg, c.data) || !namesKindOnly(msg) {
				t.Errorf("message %q shows the content's bytes", msg)
			}
		})
	}
}

// leaks reports whether msg holds the first bytes of data, raw (4 or more)
// or in hex.
func leaks(msg string, data []byte) bool {
	head := data[:min(len(data), 8)]
	if len(head) >= 4 && strings.Contains(msg, string(head[:4])) {
		return true
	}
	return len(head) >= 2 && (strings.Contains(msg, fmt.Sprintf("% x", head[:2])) || strings.Contains(msg, fmt.Sprintf("%x", head[:2])))
}

// namesKindOnly reports whether msg is the unknown-content message with one of
// contentKind's names: a fixed text that holds nothing of the content.
func namesKindOnly(msg string) bool {
	kinds := []string{"ISO media (HEIC, AVIF or video)", "tar", "binary", "XML or SVG text", "HTML text", "JSON text", "text"}
	for _, k := range contentKinds {
		kinds = append(kinds, k.kind)
	}
	for _, k := range kinds {
		if msg == "imgproc: not an image (content: "+k+"): "+ErrUnsupported.Error() {
			return true
		}
	}
	return false
}
