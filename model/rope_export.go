package model

// RopeInvFreq returns the rotary inverse frequencies [HeadDim/2] that the forward pass uses
// (rope scaling and InvFreqBF16 applied), for writers of other runtimes' graphs.
func RopeInvFreq(cfg *Config) []float32 { return newRopeTable(cfg).invFreq }
