package balancer

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"strconv"
	"unicode/utf8"
)

// WriteJSONL writes the plan, one JSON object per line, in step, rank,
// micro-batch and entry order:
//
//	{"id":"s1","epoch":0,"step":3,"rank":1,"micro_batch":0,"weight":1}
//
// followed by one line per dropped item ({"id":…,"epoch":…,"dropped":true})
// and per rejected item ({"id":…,"epoch":…,"rejected":"reason"}). The output
// is byte-identical for the same items and Config.
func (p *Plan) WriteJSONL(w io.Writer) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	ep := p.Config.Epoch
	var buf []byte
	for _, s := range p.Steps {
		for r, rank := range s.Ranks {
			for m, mb := range rank {
				for _, e := range mb {
					buf = appendHead(buf[:0], p.items[e.Item].ID, ep)
					buf = append(buf, `,"step":`...)
					buf = strconv.AppendInt(buf, int64(s.Index), 10)
					buf = append(buf, `,"rank":`...)
					buf = strconv.AppendInt(buf, int64(r), 10)
					buf = append(buf, `,"micro_batch":`...)
					buf = strconv.AppendInt(buf, int64(m), 10)
					buf = append(buf, `,"weight":`...)
					buf = strconv.AppendFloat(buf, float64(e.Weight), 'g', -1, 32)
					buf = append(buf, "}\n"...)
					if _, err := bw.Write(buf); err != nil {
						return err
					}
				}
			}
		}
	}
	for _, d := range p.Dropped {
		buf = appendHead(buf[:0], p.items[d].ID, ep)
		buf = append(buf, `,"dropped":true}`+"\n"...)
		if _, err := bw.Write(buf); err != nil {
			return err
		}
	}
	for _, rj := range p.Rejected {
		buf = appendHead(buf[:0], p.items[rj.Item].ID, ep)
		buf = append(buf, `,"rejected":`...)
		buf = appendJSONString(buf, rj.Reason)
		buf = append(buf, "}\n"...)
		if _, err := bw.Write(buf); err != nil {
			return err
		}
	}
	return bw.Flush()
}

func appendHead(buf []byte, id string, epoch int) []byte {
	buf = append(buf, `{"id":`...)
	buf = appendJSONString(buf, id)
	buf = append(buf, `,"epoch":`...)
	return strconv.AppendInt(buf, int64(epoch), 10)
}

// Hash returns the hex SHA-256 of WriteJSONL's output: equal hashes mean
// identical plans.
func (p *Plan) Hash() string {
	h := sha256.New()
	_ = p.WriteJSONL(h) // a hash.Hash never fails to write
	return hex.EncodeToString(h.Sum(nil))
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string, escaping like encoding/json
// (invalid UTF-8 becomes U+FFFD).
func appendJSONString(buf []byte, s string) []byte {
	buf = append(buf, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				buf = append(buf, '\\', c)
			case c == '\n':
				buf = append(buf, `\n`...)
			case c == '\r':
				buf = append(buf, `\r`...)
			case c == '\t':
				buf = append(buf, `\t`...)
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				buf = append(buf, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				buf = append(buf, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			buf = append(buf, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			buf = append(buf, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			buf = append(buf, s[i:i+size]...)
		}
		i += size
	}
	return append(buf, '"')
}
