package config

import (
	"net/url"
	"time"
)

// ThresholdWebhook is the threshold_webhook section: where the gateway
// sends quota threshold events (policies' thresholds; package
// dataplane/threshold). nil when the file has none: thresholds are then
// not watched at all.
type ThresholdWebhook struct {
	// URL is the receiver's http(s) URL.
	URL string
	// Secret is the HMAC-SHA256 key the events are signed with (from
	// secret_env or secret_file), at least 32 bytes.
	Secret string
	// Timeout bounds one delivery attempt; default 5 s.
	Timeout time.Duration
	// Queue is the most events waiting; default 1024. Events beyond it
	// are dropped and counted.
	Queue int
	// RetryFor bounds one event's retries; default 1 min.
	RetryFor time.Duration
}

type rawThresholdWebhook struct {
	URL        string         `json:"url"`
	SecretEnv  string         `json:"secret_env"`
	SecretFile string         `json:"secret_file"`
	Timeout    *time.Duration `json:"timeout"`
	Queue      *int           `json:"queue"`
	RetryFor   *time.Duration `json:"retry_for"`
}

// thresholdWebhook validates the threshold_webhook section.
func (v *loader) thresholdWebhook(r *rawThresholdWebhook) *ThresholdWebhook {
	w := &ThresholdWebhook{URL: r.URL}
	if u, err := url.Parse(r.URL); r.URL == "" {
		v.fail("threshold_webhook.url", "missing (the receiver's URL, like https://hooks.example/limitplane)")
	} else if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		v.fail("threshold_webhook.url", "%q is not an http:// or https:// URL", r.URL)
	}
	s, ok := v.secret("threshold_webhook", "secret", r.SecretEnv, r.SecretFile)
	switch {
	case !ok:
		v.fail("threshold_webhook", "needs secret_env or secret_file (the HMAC-SHA256 key events are signed with)")
	case len(s) < 32 && !v.failed("threshold_webhook.secret_env") && !v.failed("threshold_webhook.secret_file") && !v.failed("threshold_webhook"):
		field := "threshold_webhook.secret_env"
		if r.SecretFile != "" {
			field = "threshold_webhook.secret_file"
		}
		v.fail(field, "the secret has %d bytes; want at least 32", len(s))
	}
	w.Secret = s
	w.Timeout = number(v, "threshold_webhook.timeout", r.Timeout, 5*time.Second, positive, mustBePositive)
	w.Queue = number(v, "threshold_webhook.queue", r.Queue, 1024, within(1, 1<<20), wantWithin(1, 1<<20))
	w.RetryFor = number(v, "threshold_webhook.retry_for", r.RetryFor, time.Minute, positive, mustBePositive)
	return w
}
