package serve

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
)

// maxChanges bounds the settings a job-record refusal lists.
const maxChanges = 12

// changes names what differs between stored and r: the layout fields with
// both values, and the fingerprinted settings by path (Input, Plan.Seed,
// Image.Size, …; the record keeps only their hashes).
func (r JobRecord) changes(stored JobRecord) []string {
	var out []string
	add := func(name string, was, is any) {
		if was != is {
			out = append(out, fmt.Sprintf("%s %v → %v", name, was, is))
		}
	}
	add("job", stored.Job, r.Job)
	add("dp", stored.DP, r.DP)
	add("mp", stored.MP, r.MP)
	add("placement", stored.Placement, r.Placement)
	add("first epoch", stored.FirstEpoch, r.FirstEpoch)
	if stored.Fingerprint != r.Fingerprint {
		if len(stored.Settings) == 0 {
			out = append(out, "the fingerprinted settings (input, plan, tokenizer or image; the record predates naming them)")
		} else {
			out = append(out, settingChanges(stored.Settings, r.Settings)...)
		}
	}
	if len(out) > maxChanges {
		out = append(out[:maxChanges], fmt.Sprintf("and %d more", len(out)-maxChanges))
	}
	return out
}

// settingChanges lists the paths whose hashes differ, or that only one has.
func settingChanges(was, is map[string]string) []string {
	keys := maps.Clone(was)
	maps.Copy(keys, is)
	var out []string
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		if was[k] != is[k] {
			out = append(out, k)
		}
	}
	return out
}

// settingHashes returns a short hash of every leaf of the JSON object raw
// (arrays whole), by dotted path.
func settingHashes(raw json.RawMessage) map[string]string {
	out := map[string]string{}
	flatten("", raw, out)
	return out
}

func flatten(path string, raw json.RawMessage, out map[string]string) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil || obj == nil {
		sum := sha256.Sum256(raw)
		out[path] = hex.EncodeToString(sum[:6])
		return
	}
	for k, v := range obj {
		p := k
		if path != "" {
			p = path + "." + k
		}
		flatten(p, v, out)
	}
}
