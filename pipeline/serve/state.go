package serve

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/mmfeed/mmfeed/balancer"
	"github.com/mmfeed/mmfeed/loader"
	"github.com/mmfeed/mmfeed/proto"
	"github.com/nats-io/nats.go/jetstream"
)

// KV keys the service adds to the protocol's (config, epoch, rank.<dp>.<mp>.step;
// epoch.<e> is the epoch book's: InfoKey).
const (
	// kvFinished: the last epoch, once every batch of the job is published.
	kvFinished = "finished"
)

// JobRecord is the KV "config" value: what a restarted service must match.
type JobRecord struct {
	Job        string `json:"job"`
	DP         int    `json:"dp"`
	MP         int    `json:"mp"`
	Placement  string `json:"placement"`
	FirstEpoch int    `json:"first_epoch"`
	Epochs     int    `json:"epochs"`
	// Fingerprint is the SHA-256 of the dataset path, plan, tokenizer and
	// image configuration: the inputs of the plan besides seed and epoch.
	Fingerprint string `json:"fingerprint"`
	// Settings hashes each setting Fingerprint covers, by path (Input,
	// Plan.Seed, Image.Size, …; values are not stored), so that a refusal
	// names the settings that changed (absent in older records).
	Settings map[string]string `json:"settings,omitempty"`
}

func (c Config) jobRecord() (JobRecord, error) {
	return c.jobRecordAt(c.Pipeline.Plan.DP)
}

// jobRecordAt is the job record of this configuration at dp ranks.
func (c Config) jobRecordAt(dp int) (JobRecord, error) {
	p := c.Pipeline
	p.Plan.DP = dp
	b, err := json.Marshal(struct {
		Input     string
		Plan      balancer.Config
		Tokenizer any
		Image     any
		Mixture   *loader.Mixture `json:",omitempty"` // absent for a plain input: its fingerprint is unchanged
	}{p.Input, p.Plan, p.Tokenizer, p.Image, p.Mixture})
	if err != nil {
		return JobRecord{}, fmt.Errorf("serve: fingerprint: %w", err)
	}
	sum := sha256.Sum256(b)
	return JobRecord{Job: c.Job, DP: p.Plan.DP, MP: c.MP, Placement: p.Plan.Placement.String(),
		FirstEpoch: p.Plan.Epoch, Epochs: c.Epochs, Fingerprint: hex.EncodeToString(sum[:]), Settings: settingHashes(b)}, nil
}

// compatible reports why a stored record cannot be resumed by r.
func (r JobRecord) compatible(stored JobRecord) error {
	if stored.Job != r.Job || stored.DP != r.DP || stored.MP != r.MP || stored.Placement != r.Placement ||
		stored.FirstEpoch != r.FirstEpoch || stored.Fingerprint != r.Fingerprint {
		return fmt.Errorf("serve: job %s was started with dp=%d mp=%d placement=%s first epoch %d fingerprint %.12s, this service has dp=%d mp=%d placement=%s first epoch %d fingerprint %.12s; changed: %s (use another job name or a fresh data dir): %w",
			stored.Job, stored.DP, stored.MP, stored.Placement, stored.FirstEpoch, stored.Fingerprint,
			r.DP, r.MP, r.Placement, r.FirstEpoch, r.Fingerprint, strings.Join(r.changes(stored), "; "), ErrJobMismatch)
	}
	return nil
}

// state wraps the job's KV bucket.
type state struct{ kv jetstream.KeyValue }

func (s state) putJSON(ctx context.Context, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("serve: kv %s: %w", key, err)
	}
	if _, err := s.kv.Put(ctx, key, b); err != nil {
		return fmt.Errorf("serve: kv put %s: %w", key, err)
	}
	return nil
}

// getJSON decodes key into v; ok is false when the key does not exist.
func (s state) getJSON(ctx context.Context, key string, v any) (ok bool, err error) {
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("serve: kv get %s: %w", key, err)
	}
	if err := decodeStrict(e.Value(), v); err != nil {
		return false, fmt.Errorf("serve: kv %s: %v: %w", key, err, ErrState)
	}
	return true, nil
}

func (s state) putInt(ctx context.Context, key string, v int) error {
	if _, err := s.kv.Put(ctx, key, []byte(strconv.Itoa(v))); err != nil {
		return fmt.Errorf("serve: kv put %s: %w", key, err)
	}
	return nil
}

// getInt returns a decimal value; ok is false when the key does not exist.
func (s state) getInt(ctx context.Context, key string) (v int, ok bool, err error) {
	e, err := s.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("serve: kv get %s: %w", key, err)
	}
	v, err = parseCount(string(e.Value()))
	if err != nil {
		return 0, false, fmt.Errorf("serve: kv %s = %q: %w", key, e.Value(), ErrState)
	}
	return v, true, nil
}

func (s state) delete(ctx context.Context, key string) error {
	if err := s.kv.Delete(ctx, key); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return fmt.Errorf("serve: kv delete %s: %w", key, err)
	}
	return nil
}

// kvStore is the job's KV bucket as the epoch book (epochs.Store) and the
// rank table (deliver.Store) read and write it: s is the service's, whose
// bucket a recreation replaces.
type kvStore struct{ s *state }

func (st kvStore) PutJSON(ctx context.Context, key string, v any) error {
	return st.s.putJSON(ctx, key, v)
}

func (st kvStore) GetJSON(ctx context.Context, key string, v any) (bool, error) {
	return st.s.getJSON(ctx, key, v)
}

func (st kvStore) PutInt(ctx context.Context, key string, v int) error {
	return st.s.putInt(ctx, key, v)
}

func (st kvStore) GetInt(ctx context.Context, key string) (int, bool, error) {
	return st.s.getInt(ctx, key)
}

func (st kvStore) Delete(ctx context.Context, key string) error { return st.s.delete(ctx, key) }

func (st kvStore) RankStep(ctx context.Context, dp, mp int) (epoch, step int, ok bool, err error) {
	return proto.GetRankStep(ctx, st.s.kv, dp, mp)
}

func (st kvStore) Bucket() bool { return st.s != nil && st.s.kv != nil }

// parseCount parses a canonical non-negative decimal below 2^31.
func parseCount(s string) (int, error) {
	if s == "" || len(s) > 10 || (len(s) > 1 && s[0] == '0') {
		return 0, ErrState
	}
	v, err := strconv.ParseUint(s, 10, 31)
	if err != nil {
		return 0, ErrState
	}
	return int(v), nil
}

// decodeStrict decodes one JSON value with no unknown fields.
func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}
