package managementapi

// HugeBodies gives the external tests the fuzz target's huge request bodies.
var HugeBodies = hugeBodies
