-- Films per actor with their average rental rate (pagila).
-- keys: actor_id
-- sources: actor, film_actor, film
SELECT a.actor_id,
       a.first_name,
       a.last_name,
       COUNT(f.film_id)                AS films,
       CAST(AVG(f.rental_rate) AS DECIMAL(6, 2)) AS avg_rental_rate
FROM actor a
LEFT JOIN film_actor fa ON fa.actor_id = a.actor_id
LEFT JOIN film f ON f.film_id = fa.film_id
GROUP BY a.actor_id, a.first_name, a.last_name
