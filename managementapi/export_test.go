package managementapi

// HugeBodies gives the external tests the fuzz target's huge request bodies.
var HugeBodies = hugeBodies

// AppendUsageJSON and NewUsage are the usage's JSON writer and the Usage it writes.
var (
	AppendUsageJSON = appendUsageJSON
	NewUsage        = newUsage
)
