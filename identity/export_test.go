package identity

// SignRaw lets the external e2e tests (package identity_test) use signRaw,
// the one helper that signs header and claims JSON texts as written.
var SignRaw = signRaw
