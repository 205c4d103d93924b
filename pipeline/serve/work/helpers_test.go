package work

import "github.com/mmfeed/mmfeed/internal/testnats"

// The test helpers the planner's tests share with serve's (internal/testnats).
var (
	checkFor   = testnats.CheckFor
	freePort   = testnats.FreePort
	testLogger = testnats.Logger
)
