-- Customers per e-mail domain (Debezium tutorial inventory).
-- keys: email_domain
-- sources: inventory_customers
SELECT COALESCE(LOWER(SUBSTRING_INDEX(email, '@', -1)), 'unknown') AS email_domain,
       COUNT(*)                                AS customers
FROM inventory_customers
GROUP BY 1
