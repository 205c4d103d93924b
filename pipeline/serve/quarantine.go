package serve

import (
	"context"

	"github.com/mmfeed/mmfeed/pipeline/serve/natsenv"
	"github.com/nats-io/nats.go/jetstream"
)

// QuarantineBucket returns the KV bucket of a job's quarantine records:
// mmfeed_<job>_quarantine.
func QuarantineBucket(job string) string { return natsenv.QuarantineBucket(job) }

func openQuarantineKV(ctx context.Context, js jetstream.JetStream, job string, replicas int) (jetstream.KeyValue, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: QuarantineBucket(job),
		Description: "mmfeed quarantine records of job " + job + ", one per sample",
		History:     1, Storage: jetstream.FileStorage, Replicas: max(replicas, 1)})
	if err != nil {
		return nil, err
	}
	return kv, nil
}
