\set k random(1, 16)
INSERT INTO pgb.floor (name, v) VALUES ('n' || :client_id || '-' || :k, 1) ON CONFLICT (name) DO UPDATE SET v = EXCLUDED.v + 1;
UPDATE pgb.floor SET v = 0 WHERE name = 'n' || :client_id || '-' || :k;
