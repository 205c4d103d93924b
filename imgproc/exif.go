package imgproc

import (
	"bytes"
	"encoding/binary"
)

// exifOrientation finds the EXIF orientation (1..8) in the container's
// metadata without decoding pixels: JPEG APP1 "Exif", PNG eXIf chunk, WebP
// EXIF chunk, TIFF IFD0. Anything missing, malformed or out of range gives 1.
func exifOrientation(format string, data []byte) int {
	var tiffData []byte
	switch format {
	case FormatJPEG:
		tiffData = jpegExif(data)
	case FormatPNG:
		tiffData = pngExif(data)
	case FormatWebP:
		tiffData = webpExif(data)
	case FormatTIFF:
		tiffData = data
	}
	if tiffData == nil {
		return 1
	}
	return tiffOrientation(tiffData)
}

// jpegExif walks JPEG marker segments up to the first scan and returns the
// TIFF payload of the first APP1 Exif segment.
func jpegExif(d []byte) []byte {
	i := 2
	for i+4 <= len(d) {
		if d[i] != 0xFF {
			return nil
		}
		m := d[i+1]
		switch {
		case m == 0xFF: // fill byte
			i++
			continue
		case m == 0x01 || (m >= 0xD0 && m <= 0xD7): // standalone markers
			i += 2
			continue
		case m == 0xDA || m == 0xD9: // start of scan / end of image
			return nil
		}
		n := int(binary.BigEndian.Uint16(d[i+2:]))
		if n < 2 || i+2+n > len(d) {
			return nil
		}
		seg := d[i+4 : i+2+n]
		if m == 0xE1 && bytes.HasPrefix(seg, []byte("Exif\x00\x00")) {
			return seg[6:]
		}
		i += 2 + n
	}
	return nil
}

// pngExif returns the payload of the eXIf chunk, scanning chunk headers only.
func pngExif(d []byte) []byte {
	i := 8
	for i+8 <= len(d) {
		n := int(binary.BigEndian.Uint32(d[i:]))
		typ := string(d[i+4 : i+8])
		if n < 0 || n > len(d)-i-8 {
			return nil
		}
		if typ == "eXIf" {
			return trimExifPrefix(d[i+8 : i+8+n])
		}
		if typ == "IEND" {
			return nil
		}
		i += 12 + n
	}
	return nil
}

// webpExif returns the payload of the RIFF EXIF chunk.
func webpExif(d []byte) []byte {
	i := 12
	for i+8 <= len(d) {
		n := int(binary.LittleEndian.Uint32(d[i+4:]))
		if n < 0 || n > len(d)-i-8 {
			return nil
		}
		if string(d[i:i+4]) == "EXIF" {
			return trimExifPrefix(d[i+8 : i+8+n])
		}
		i += 8 + n + n&1 // chunks are padded to even sizes
	}
	return nil
}

func trimExifPrefix(b []byte) []byte {
	return bytes.TrimPrefix(b, []byte("Exif\x00\x00"))
}

// tiffOrientation reads tag 0x0112 (Orientation) from IFD0 of a TIFF
// structure; 1 when absent or invalid.
func tiffOrientation(t []byte) int {
	if len(t) < 8 {
		return 1
	}
	var bo binary.ByteOrder
	switch string(t[:2]) {
	case "II":
		bo = binary.LittleEndian
	case "MM":
		bo = binary.BigEndian
	default:
		return 1
	}
	if bo.Uint16(t[2:]) != 42 {
		return 1
	}
	off := int64(bo.Uint32(t[4:]))
	if off < 8 || off+2 > int64(len(t)) {
		return 1
	}
	n := int64(bo.Uint16(t[off:]))
	for e := int64(0); e < n; e++ {
		p := off + 2 + 12*e
		if p+12 > int64(len(t)) {
			return 1
		}
		if bo.Uint16(t[p:]) != 0x0112 {
			continue
		}
		var v int
		switch bo.Uint16(t[p+2:]) {
		case 3: // SHORT
			v = int(bo.Uint16(t[p+8:]))
		case 4: // LONG
			v = int(bo.Uint32(t[p+8:]))
		default:
			return 1
		}
		if v < 1 || v > 8 {
			return 1
		}
		return v
	}
	return 1
}
