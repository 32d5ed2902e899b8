\set k random(1, 16)
INSERT INTO pgb.leases (name, owner, acquired_at, expires_at) VALUES ('n' || :client_id || '-' || :k, 'x', now(), now()) ON CONFLICT (name) DO UPDATE SET token = DEFAULT, owner = 'o', acquired_at = now(), expires_at = now() + interval '30 s';
UPDATE pgb.leases SET owner = NULL, acquired_at = NULL, expires_at = NULL WHERE name = 'n' || :client_id || '-' || :k;
