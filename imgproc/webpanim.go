package imgproc

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"image"

	"golang.org/x/image/webp"
)

// frameInCanvas checks that the first frame of an animated WebP (still, at
// off) lies inside the canvas its VP8X chunk declares: the header check
// bounds the canvas by MaxImagePixels, so a frame whose own bitstream claims
// more (a small canvas hiding a huge frame) would slip past it. The frame's
// size is read from its bitstream, which is what the decoder allocates.
func frameInCanvas(data, still []byte, off image.Point) error {
	cw, ch := u24(data[24:])+1, u24(data[27:])+1
	cfg, err := webp.DecodeConfig(bytes.NewReader(still))
	if err != nil {
		return fmt.Errorf("imgproc: webp frame header: %v: %w", err, ErrCorrupt)
	}
	if cfg.Width > cw-off.X || cfg.Height > ch-off.Y {
		return fmt.Errorf("imgproc: webp frame %dx%d at %v outside the %dx%d canvas: %w",
			cfg.Width, cfg.Height, off, cw, ch, ErrTooLarge)
	}
	return nil
}

// webpFirstFrame extracts the first frame of an animated WebP (VP8X with the
// animation flag) as a standalone still WebP, with the frame's offset on
// the canvas. ok is false when data is not an animated WebP or the frame
// cannot be found; the caller then decodes data as is.
func webpFirstFrame(data []byte) (still []byte, off image.Point, ok bool) {
	if len(data) < 30 || string(data[12:16]) != "VP8X" || data[20]&0x02 == 0 {
		return nil, image.Point{}, false
	}
	for i := 12; i+8 <= len(data); {
		n := int(binary.LittleEndian.Uint32(data[i+4:]))
		if n < 0 || n > len(data)-i-8 {
			return nil, image.Point{}, false
		}
		if string(data[i:i+4]) == "ANMF" {
			return stillFromANMF(data[i+8 : i+8+n])
		}
		i += 8 + n + n&1
	}
	return nil, image.Point{}, false
}

func u24(b []byte) int { return int(b[0]) | int(b[1])<<8 | int(b[2])<<16 }

// stillFromANMF rebuilds a RIFF WebP from an ANMF payload: 16 header bytes
// (x/2, y/2, w-1, h-1, duration, flags) then ALPH? and VP8 or VP8L chunks.
func stillFromANMF(p []byte) ([]byte, image.Point, bool) {
	if len(p) < 16 {
		return nil, image.Point{}, false
	}
	off := image.Pt(2*u24(p[0:]), 2*u24(p[3:]))
	fw, fh := u24(p[6:])+1, u24(p[9:])+1
	var alph, bits []byte
	for i := 16; i+8 <= len(p); {
		n := int(binary.LittleEndian.Uint32(p[i+4:]))
		if n < 0 || n > len(p)-i-8 {
			return nil, image.Point{}, false
		}
		end := min(i+8+n+n&1, len(p))
		switch string(p[i : i+4]) {
		case "ALPH":
			alph = p[i:end]
		case "VP8 ", "VP8L":
			bits = p[i:end]
		}
		i = end
	}
	if bits == nil {
		return nil, image.Point{}, false
	}
	var body []byte
	if alph != nil && string(bits[:4]) == "VP8 " {
		vp8x := make([]byte, 18)
		copy(vp8x, "VP8X")
		binary.LittleEndian.PutUint32(vp8x[4:], 10)
		vp8x[8] = 0x10 // alpha
		w1, h1 := fw-1, fh-1
		vp8x[12], vp8x[13], vp8x[14] = byte(w1), byte(w1>>8), byte(w1>>16)
		vp8x[15], vp8x[16], vp8x[17] = byte(h1), byte(h1>>8), byte(h1>>16)
		body = append(append(vp8x, alph...), bits...)
	} else {
		body = bits
	}
	out := make([]byte, 12, 12+len(body))
	copy(out, "RIFF")
	binary.LittleEndian.PutUint32(out[4:], uint32(4+len(body)))
	copy(out[8:], "WEBP")
	return append(out, body...), off, true
}
