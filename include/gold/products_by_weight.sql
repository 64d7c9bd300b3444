-- Products per weight band (Debezium tutorial inventory).
-- keys: weight_band
-- sources: products
SELECT CASE WHEN weight IS NULL THEN 'unknown'
            WHEN weight < 1 THEN 'light (<1)'
            WHEN weight < 5 THEN 'medium (1-5)'
            ELSE 'heavy (5+)' END AS weight_band,
       COUNT(*)                    AS products,
       CAST(AVG(weight) AS DOUBLE) AS avg_weight
FROM products
GROUP BY 1
