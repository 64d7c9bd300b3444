-- keys: last_name
-- sources: actor
SELECT last_name, count(*) AS actors, max(last_update) AS last_update
FROM actor
GROUP BY last_name
