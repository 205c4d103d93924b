package serve

import "github.com/mmfeed/mmfeed/pipeline/serve/natsenv"

// QuarantineBucket returns the KV bucket of a job's quarantine records:
// mmfeed_<job>_quarantine.
func QuarantineBucket(job string) string { return natsenv.QuarantineBucket(job) }
