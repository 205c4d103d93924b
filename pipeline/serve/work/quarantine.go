package work

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// QuarantineKey returns the key of a sample's quarantine record: "s." and
// the sample id in unpadded base64url (any id is a valid key that way), or
// "l." and the location when the record has no id.
func QuarantineKey(id, location string) string {
	if id == "" {
		return "l." + base64.RawURLEncoding.EncodeToString([]byte(location))
	}
	return "s." + base64.RawURLEncoding.EncodeToString([]byte(id))
}

// QuarantineSink receives the quarantine JSON lines of an epoch's
// preparation (one record per Write, as loader.QuarantineWriter writes
// them), writes them to the local file when there is one, and records each
// sample once in the job's quarantine bucket: the first record wins,
// whichever epoch or service found it. A record the bucket cannot take is
// logged, not fatal: the file and the counts still have it.
type QuarantineSink struct {
	kv   jetstream.KeyValue
	file io.Writer // nil: none
	log  *slog.Logger
	// recorded, when not nil, holds the keys the bucket is known to have
	// (shared by the copies of the sink every epoch makes): each epoch
	// quarantines the dataset's rejects again, and the bucket is asked once
	// per sample, not once per epoch.
	recorded *sync.Map
}

// NewQuarantineSink returns a sink that records to kv; once, it also
// remembers the keys the bucket has (recorded), for a service whose every
// epoch quarantines the same rejects again.
func NewQuarantineSink(kv jetstream.KeyValue, log *slog.Logger, once bool) *QuarantineSink {
	q := &QuarantineSink{kv: kv, log: log}
	if once {
		q.recorded = &sync.Map{}
	}
	return q
}

// WithFile returns a copy of q that writes each record to file first (nil:
// none); the copies share what recorded holds.
func (q *QuarantineSink) WithFile(file io.Writer) *QuarantineSink {
	c := *q
	c.file = file
	return &c
}

func (q *QuarantineSink) Write(p []byte) (int, error) {
	if q.file != nil {
		if n, err := q.file.Write(p); err != nil {
			return n, err
		}
	}
	var r struct {
		ID       string `json:"id"`
		Location string `json:"location"`
	}
	if err := json.Unmarshal(bytes.TrimSpace(p), &r); err != nil {
		q.log.Warn("quarantine record", "err", err)
		return len(p), nil
	}
	key := QuarantineKey(r.ID, r.Location)
	if q.recorded != nil {
		if _, ok := q.recorded.Load(key); ok {
			return len(p), nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := q.kv.Create(ctx, key, bytes.TrimSpace(p)); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		q.log.Warn("quarantine record to kv", "id", r.ID, "err", err)
	} else if q.recorded != nil {
		q.recorded.Store(key, struct{}{})
	}
	return len(p), nil
}
