-- Dashboard sessions carry no per-form CSRF token any more: every state-changing dashboard
-- request must be same-origin (http.CrossOriginProtection, null origins refused) and the session
-- cookie is SameSite=Strict, which the tests show is the same protection.
ALTER TABLE dashboard_sessions DROP COLUMN csrf_token;
